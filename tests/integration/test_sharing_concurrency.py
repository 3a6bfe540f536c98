"""Property: whatever mix of share, MIG (static and dynamic layouts) and vGPU requests arrives at once, in whatever windows, nothing is
over-granted and every reservation is charged the sum of its grants. Real PostgreSQL, concurrent writers."""
from __future__ import annotations

import threading
from collections import defaultdict
from datetime import timedelta

import pytest
from django.db import connection
from django.utils import timezone
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from allocations import services, units
from allocations.models import Allocation, Reservation
from allocations.placement import mig
from common.errors import ApplicationError
from inventory.models import GpuModel
from tests.factories import (
    ClusterFactory,
    GpuFactory,
    MembershipFactory,
    NodeFactory,
    PoolFactory,
    QuotaFactory,
    TeamFactory,
    UserFactory,
)

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]

A100 = "NVIDIA A100-SXM4-80GB"
MEMORY = 81920


@pytest.fixture
def fleet(transactional_db):
    from tests.conftest import _require_postgresql

    _require_postgresql()
    team = TeamFactory(slug="vision")
    users = [UserFactory(username=f"racer{i}") for i in range(3)]
    for user in users:
        MembershipFactory(user=user, team=team)
    GpuModel.objects.create(name=A100, weight="0.6")
    cluster = ClusterFactory(slug="lab")
    for slug, mode, config in (("ts", "time_slicing", {"replicas": 4}), ("mps", "mps", {"replicas": 3}),
                               ("mig", "mig", {"mig_layout": "all-balanced"}), ("hami", "vgpu", {}),
                               ("dmig", "mig", {"dynamic": True})):
        pool = PoolFactory(slug=slug, sharing_mode=mode, sharing_config=config)
        for n in range(2):
            node = NodeFactory(cluster=cluster, name=f"{slug}-{n}")
            GpuFactory(node=node, pool=pool, index=0, model_name=A100, memory_mib=MEMORY)
        QuotaFactory(team=team, pool=pool, max_ge=100)
    return users


request = st.one_of(
    st.fixed_dictionaries({"pool": st.just("ts"), "shares": st.integers(1, 4)}),
    st.fixed_dictionaries({"pool": st.just("mps"), "shares": st.integers(1, 3)}),
    st.fixed_dictionaries({"pool": st.just("mig"), "mig_profile": st.sampled_from(["1g.10gb", "2g.20gb", "3g.40gb"]),
                           "count": st.integers(1, 3)}),
    # A dynamic MIG pool: every GPU's layout is carved per window, so the slices are the only guard.
    st.fixed_dictionaries({"pool": st.just("dmig"), "mig_profile": st.sampled_from(["1g.10gb", "2g.20gb", "3g.40gb",
                                                                                   "4g.40gb", "7g.80gb"]),
                           "count": st.integers(1, 3)}),
    st.fixed_dictionaries({"pool": st.just("hami"), "gpu_memory_mib": st.integers(1000, 60000),
                           "gpu_cores_pct": st.integers(1, 70), "gpus": st.integers(1, 1)}),
)
# (request, start in hours from now, hours): all in the future, so nothing is handed to a worker to apply.
timed = st.tuples(request, st.integers(1, 4), st.integers(1, 3))


def _book(user, asks, now, outcomes) -> None:
    try:
        for ask, lead, hours in asks:
            ask = dict(ask)
            start = now + timedelta(hours=lead)
            end = start + timedelta(hours=hours)
            try:
                services.reservation_create(actor=user, request=services.ReservationRequest(
                    team="vision", ends_at=end, starts_at=start, **ask), now=now)
                outcomes.append("booked")
            except ApplicationError as refused:
                outcomes.append(refused.errors[0].rule)
    finally:
        connection.close()


def _expected_ge(row) -> float:
    mode, milli, profile, memory, cores, replicas = row
    if mode in ("time_slicing", "mps"):
        return units.share_slots(milli, replicas) / replicas * 0.6
    if mode == "mig":
        return mig.profile_for(A100, profile).compute_slices / units.MIG_COMPUTE_SLICES * 0.6
    if mode == "vgpu":
        return max(memory / MEMORY, cores / 100) * 0.6
    return 0.6


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(asks=st.lists(timed, min_size=3, max_size=12))
def test_concurrent_share_mig_and_vgpu_bookings_never_over_grant(fleet, asks):
    Allocation.objects.all().delete()
    Reservation.objects.all().delete()
    now = timezone.now()
    outcomes: list[str] = []
    threads = [threading.Thread(target=_book, args=(user, asks[i::3], now, outcomes)) for i, user in enumerate(fleet)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(outcomes) == len(asks)
    assert set(outcomes) <= {"booked", "fragmented", "insufficient_capacity"}, outcomes

    rows = list(Allocation.objects.values_list("gpu_id", "starts_at", "ends_at", "mode", "share_from", "share_to",
                                               "memory_mib", "cores_pct", "ge", "reservation_id", "milli",
                                               "mig_profile", "reservation__pool__sharing_config", "mig_start"))
    by_gpu = defaultdict(list)
    for row in rows:
        by_gpu[row[0]].append(row)
    for grants in by_gpu.values():
        shares = [g for g in grants if g[3] != "vgpu"]
        for i, a in enumerate(shares):
            for b in shares[i + 1:]:
                if a[1] < b[2] and b[1] < a[2]:  # at the same time: disjoint parts of the card
                    assert a[5] <= b[4] or b[5] <= a[4], (a, b)
        vgpus = [g for g in grants if g[3] == "vgpu"]
        if vgpus:
            assert not shares
            start, end = min(g[1] for g in vgpus), max(g[2] for g in vgpus)
            assert units.peak(((g[1], g[2], g[6]) for g in vgpus), start, end).amount <= MEMORY
            assert units.peak(((g[1], g[2], g[7]) for g in vgpus), start, end).amount <= 100
    for row in rows:  # a MIG instance sits at a legal start and holds exactly its memory slices
        if row[3] == "mig":
            profile = mig.profile_for(A100, row[11])
            assert row[13] in profile.starts and (row[4], row[5]) == (row[13] * 125, (row[13] + profile.size) * 125)
    charged = defaultdict(float)
    for row in rows:
        replicas = (row[12] or {}).get("replicas")
        assert row[8] == pytest.approx(_expected_ge((row[3], row[10], row[11], row[6], row[7], replicas)))
        charged[row[9]] += row[8]
    for reservation in Reservation.objects.all():
        assert reservation.ge == pytest.approx(charged[reservation.pk])
    assert Reservation.objects.count() == outcomes.count("booked")
