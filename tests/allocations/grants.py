"""Grants of every sharing mode written directly as Allocation rows, as the contract in
notes/COMMON.md ("the grant rows") describes them, for tests that read use in GPU-equivalents."""
from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from decimal import Decimal

from django.utils import timezone

from allocations import quota_math
from allocations.models import Allocation, Reservation
from inventory.models import Gpu, GpuModel
from tests.factories import GpuFactory, NodeFactory, PoolFactory, QuotaFactory

L4, A100 = "NVIDIA L4", "NVIDIA A100-SXM4-80GB"
H100 = "NVIDIA H100 80GB HBM3"


@dataclass
class Grant:
    team_id: int
    pool: str
    mode: str
    model: str
    ge: float
    starts_at: datetime
    ends_at: datetime


def _gpus(pool, model: str, count: int, node_name: str) -> list[Gpu]:
    node = NodeFactory(name=node_name)
    return [GpuFactory(node=node, pool=pool, index=i, model_name=model, memory_mib=81920) for i in range(count)]


def _grant(grants, team, pool, gpu, start, end, *, mode, ge, milli=1000, share=(0, 1000), **more) -> None:
    reservation = Reservation.objects.create(team=team, pool=pool, gpus=1, state="active", mode=mode, ge=ge,
                                             starts_at=start, ends_at=max(end, start + timedelta(seconds=1)))
    Allocation.objects.create(reservation=reservation, gpu=gpu, starts_at=start, ends_at=end, mode=mode, ge=ge,
                              milli=milli, share_from=share[0], share_to=share[1], **more)
    grants.append(Grant(team.pk, pool.slug, mode, gpu.model_name, ge, start, end))


def mixed_grants(world, now: datetime | None = None) -> list[Grant]:
    """Weights H100 2.0, L4 0.5 (A100 none: 1.0). The team `ml` holds, in GE:
    exclusive 2 H100 of a100 (2 x 2.0), 3 of 4 time-slicing shares of one L4 (3 x 0.5/4), a 3g and a
    1g MIG instance of one A100 (3/7, 1/7) and a vgpu grant of 40 % memory / 25 % cores of another
    (0.4); a past grant and a cancelled (empty) one; the team `infra` one H100 share (not ml's)."""
    now = now or timezone.now()
    GpuModel.objects.create(name=H100, weight=Decimal("2"))
    GpuModel.objects.create(name=L4, weight=Decimal("0.5"))
    ts = PoolFactory(slug="l4-ts", sharing_mode="time_slicing", sharing_config={"replicas": 4})
    mig = PoolFactory(slug="a100-mig", sharing_mode="mig", sharing_config={"mig_layout": "all-balanced"})
    vgpu = PoolFactory(slug="a100-vgpu", sharing_mode="vgpu")
    for pool in (ts, mig, vgpu):
        QuotaFactory(team=world.team, pool=pool, max_ge=Decimal("2.5"), ge_hours_per_month=Decimal("100.0"))
    [l4] = _gpus(ts, L4, 1, "node-ts")
    [a100] = _gpus(mig, A100, 1, "node-mig")
    [a100_v] = _gpus(vgpu, A100, 1, "node-vgpu")
    h100 = list(world.pool.gpus.order_by("pk"))
    grants: list[Grant] = []
    hour = timedelta(hours=1)
    for gpu in h100[:2]:
        _grant(grants, world.team, world.pool, gpu, now - hour, now + 2 * hour, mode="exclusive", ge=2.0)
    for slot in range(3):
        _grant(grants, world.team, ts, l4, now - hour / 2, now + hour, mode="time_slicing", ge=0.5 / 4,
               milli=250, share=(slot * 250, slot * 250 + 250))
    _grant(grants, world.team, mig, a100, now - hour, now + 3 * hour, mode="mig", ge=3 / 7, milli=429,
           share=(0, 500), mig_profile="3g.40gb", mig_start=0, memory_mib=40192)
    _grant(grants, world.team, mig, a100, now + hour, now + 4 * hour, mode="mig", ge=1 / 7, milli=143,
           share=(750, 875), mig_profile="1g.10gb", mig_start=6, memory_mib=9856)
    _grant(grants, world.team, vgpu, a100_v, now - hour, now + hour, mode="vgpu", ge=0.4, milli=400,
           memory_mib=32768, cores_pct=25)
    _grant(grants, world.team, world.pool, h100[2], now - 5 * hour, now - 3 * hour, mode="exclusive", ge=2.0)
    _grant(grants, world.team, world.pool, h100[3], now + hour, now + hour, mode="exclusive", ge=2.0)  # cancelled
    _grant(grants, world.other_team, world.pool, h100[4], now - hour, now + hour, mode="exclusive", ge=2.0)
    return grants


def by_hand(grants: list[Grant], team_id: int, now: datetime, **match) -> tuple[float, float]:
    """(GE held at `now`, GE-hours within now's month) of the team's grants matching `match`."""
    start = quota_math.month_start(now)
    month = (start, quota_math.next_month(start))
    mine = [g for g in grants if g.team_id == team_id and all(getattr(g, k) == v for k, v in match.items())]
    held = sum(g.ge for g in mine if g.starts_at <= now < g.ends_at)
    hours = sum(g.ge * quota_math.overlap_hours((g.starts_at, g.ends_at), month) for g in mine)
    return held, hours
