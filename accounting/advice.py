"""Right-sizing advice: the smallest shape that would have held what a team's (or a user's) last bookings
really used, and the GE-hours a month it would save. Computed on demand from the reservations, their
grants and the GPUs' minute rollups (monitoring); nothing is stored.

For each group of like bookings (one pool, one shape) among the last ADVICE_RESERVATIONS ended ones of
the team (and user), each booking's telemetry is read over its grants' windows: per GPU the peak memory
in use (mem_used_max) and the 95th percentile of the minutes' utilization (util_avg), and which of its
GPUs were busy at all (monitoring.idle.busy_minute, the rule the ledger and idle reclaim use). A booking
whose grants have telemetry for less than half of their minutes is not counted. With at least
MIN_RESERVATIONS counted, the group needs, per GPU, the largest peak memory and p95 utilization any of
them showed, with HEADROOM to spare, on as many GPUs as the busiest used. Each pool the team has a quota
in, with GPUs of the same model, offers its unit: a MIG profile of its layout (allocations.placement.mig's
table), k of its N shares, a vGPU size (memory to the GiB, cores to 5 %), or whole GPUs (fewer of
them). The smallest that holds the need is advised when its GE is at most FAR_BELOW of what was held.

Telemetry is per card: on a shared card (shares, MIG, vGPU) it counts the other holders' use too, so
what a share needed reads high and advice errs towards none. GE arithmetic goes through allocations.units.
"""
from __future__ import annotations

import math
from bisect import bisect_left
from collections import defaultdict
from dataclasses import asdict, dataclass, field
from datetime import datetime

from django.conf import settings
from django.db.models import BooleanField, ExpressionWrapper, F, Q, QuerySet
from django.utils.translation import gettext as _

from allocations import units
from allocations.booking import vgpu_fraction
from allocations.models import Allocation, Quota, Reservation
from allocations.placement import mig
from inventory.models import Gpu, GpuPool
from inventory.selectors import model_weights, weight_of
from inventory.sharing import SharingMode, mig_layout_names, replicas_of
from monitoring.idle import busy_minute
from monitoring.models import MinuteRollup
from monitoring.shares import share_memory_mib
from teams.models import Team

MIN_RESERVATIONS = 3
HEADROOM = 1.2
FAR_BELOW = 0.5
MIN_COVERAGE = 0.5
VGPU_MEMORY_STEP_MIB = 1024
VGPU_CORES_STEP_PCT = 5
DAYS_PER_MONTH = 30


@dataclass
class Held:
    """One booking's telemetry: per GPU (gpu id → figures), over its grants' windows."""

    reservation_id: int
    ge: float
    hours: float
    started: datetime
    ended: datetime
    gpus: int
    memory_mib: int  # what it held of each card's memory
    model: str
    peak_memory_mib: int = 0
    p95_util: float = 0.0
    busy_gpus: int = 0


@dataclass
class Advice:
    team: str
    user: str | None
    pool: str
    held: str  # the shape, in words
    held_ge: float  # per booking, the average of those counted
    reservations: int
    peak_memory_mib: int
    held_memory_mib: int
    p95_util_pct: float
    busy_gpus: int
    gpu_model: str
    suggest_pool: str
    suggest_mode: str
    suggest: str  # the shape, in words
    suggest_ge: float
    ge_hours_booked_per_month: float
    ge_hours_saved_per_month: float
    reservation_ids: list[int] = field(default_factory=list)

    @property
    def explanation(self) -> str:
        return _("The last %(n)d bookings of %(held)s in %(pool)s (%(held_ge)s GE each) used at most %(peak)s GiB "
                 "of %(memory)s GiB and %(util)s%% utilization (95th percentile) on %(busy)d GPU(s): %(suggest)s "
                 "in %(target)s holds that with %(headroom)d%% to spare, for %(ge)s GE, saving %(saved)s GE-hours "
                 "a month at the %(booked)s GE-hours a month booked.") % {
            "n": self.reservations, "held": self.held, "pool": self.pool, "held_ge": _num(self.held_ge),
            "peak": _num(self.peak_memory_mib / 1024), "memory": _num(self.held_memory_mib / 1024),
            "util": _num(self.p95_util_pct), "busy": self.busy_gpus, "suggest": self.suggest,
            "target": self.suggest_pool, "headroom": round((HEADROOM - 1) * 100), "ge": _num(self.suggest_ge),
            "saved": _num(self.ge_hours_saved_per_month), "booked": _num(self.ge_hours_booked_per_month)}

    def data(self) -> dict:
        out = asdict(self)
        out["explanation"] = self.explanation
        return out


def _num(value: float) -> str:
    return f"{value:.1f}".rstrip("0").rstrip(".") if value < 100 else f"{value:.0f}"


def _p95(values: list[float]) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, math.ceil(0.95 * len(ordered)) - 1)]


def _rollups(grants: list[tuple]) -> dict[int, list[tuple]]:
    """The minute rollups under every one of `grants`' windows, read in one query (a page shows advice for 20
    bookings: two queries per grant cost the team page 119 queries at fleet size): gpu id → its
    (bucket, util_avg, mem_used_max, busy) by bucket. A minute under two grants' windows (shares of one card)
    is read once and counted for each."""
    if not grants:
        return {}
    windows = Q()
    for gpu_id, starts_at, ends_at, *_ in grants:
        start = int(starts_at.timestamp())
        windows |= Q(gpu_id=gpu_id, bucket__gte=start - start % 60, bucket__lt=int(ends_at.timestamp()))
    by_gpu: dict[int, list[tuple]] = defaultdict(list)
    for gpu_id, *row in (MinuteRollup.objects.filter(windows)
                         .annotate(busy=ExpressionWrapper(busy_minute(), output_field=BooleanField()))
                         .order_by("gpu_id", "bucket")
                         .values_list("gpu_id", "bucket", "util_avg", "mem_used_max", "busy")):
        by_gpu[gpu_id].append(tuple(row))
    return by_gpu


def _held(reservation: Reservation, grants: list[tuple], rollups: dict[int, list[tuple]]) -> Held | None:
    """One ended booking's figures from its grants' minute rollups (`_rollups`); None without enough telemetry."""
    utils: list[float] = []
    peak, busy, minutes, with_data = 0, 0, 0, 0
    memory, model = 0, ""
    for gpu_id, starts_at, ends_at, mode, milli, memory_cap, gpu_memory, gpu_model, replicas in grants:
        model = gpu_model
        memory = max(memory, share_memory_mib(mode, gpu_memory, [(memory_cap, milli)], replicas))
        start, end = int(starts_at.timestamp()), int(ends_at.timestamp())
        rows = rollups.get(gpu_id, [])
        figures = rows[bisect_left(rows, start - start % 60, key=_bucket):bisect_left(rows, end, key=_bucket)]
        minutes += max(1, (end - start) // 60)
        with_data += len(figures)
        utils += [util for _b, util, _m, _busy in figures]
        peak = max([peak, *(mem for _b, _u, mem, _busy in figures)])
        busy += any(is_busy for *_, is_busy in figures)
    if not grants or with_data < MIN_COVERAGE * minutes:
        return None
    hours = sum((e - s).total_seconds() for _g, s, e, *_ in grants) / 3600 / max(1, len({g[0] for g in grants}))
    return Held(reservation.pk, reservation.ge, hours, min(g[1] for g in grants), max(g[2] for g in grants),
                len({g[0] for g in grants}), memory, model, peak, _p95(utils), busy)


def _bucket(row: tuple) -> int:
    return row[0]


def _shape_words(reservation: Reservation) -> str:
    if reservation.mode == SharingMode.MIG:
        return _("%(count)d × %(profile)s") % {"count": reservation.mig_count or 1, "profile": reservation.mig_profile}
    if reservation.mode in (SharingMode.TIME_SLICING, SharingMode.MPS):
        return _("%(k)d share(s)") % {"k": reservation.shares or 1}
    if reservation.mode == SharingMode.VGPU:
        return _("%(gpus)d × vGPU %(memory)s GiB / %(cores)d%%") % {
            "gpus": reservation.gpus, "memory": _num((reservation.gpu_memory_mib or 0) / 1024),
            "cores": reservation.gpu_cores_pct or 0}
    return _("%(gpus)d whole GPU(s)") % {"gpus": reservation.gpus}


def _offers(pool: GpuPool, model: str, memory_mib: int, weight: float, need_mib: float, need_compute: float,
            gpus: int, held_gpus: int) -> list[tuple[float, str]]:
    """(GE per booking, shape in words) of each unit `pool` offers on `model` cards that holds the need."""
    mode = pool.sharing_mode
    out = []
    if mode == SharingMode.MIG:
        names = mig_layout_names(pool.sharing_config or {})
        try:
            layout = mig.named_layout(model, names) if isinstance(names, str) else list(names)
        except mig.LayoutError:
            layout = []
        for name in sorted(set(layout)):
            profile = mig.profile_for(model, name)
            if profile and profile.memory_mib >= need_mib and profile.compute_slices / units.MIG_COMPUTE_SLICES >= need_compute:
                out.append((gpus * units.ge(units.mig_milli(profile.compute_slices), weight),
                            _("%(count)d × %(profile)s") % {"count": gpus, "profile": name}))
    elif mode in (SharingMode.TIME_SLICING, SharingMode.MPS):
        replicas = replicas_of(pool.sharing_config)
        if replicas and gpus == 1:
            for k in range(1, replicas):
                if memory_mib * k / replicas >= need_mib and k / replicas >= need_compute:
                    out.append((units.ge(k * units.share_slot_width(replicas), weight),
                                _("%(k)d of %(n)d shares") % {"k": k, "n": replicas}))
                    break
    elif mode == SharingMode.VGPU:
        memory = math.ceil(need_mib / VGPU_MEMORY_STEP_MIB) * VGPU_MEMORY_STEP_MIB
        cores = max(VGPU_CORES_STEP_PCT, math.ceil(need_compute * 100 / VGPU_CORES_STEP_PCT) * VGPU_CORES_STEP_PCT)
        if memory <= memory_mib and cores <= 100:
            milli = math.ceil(vgpu_fraction(memory, cores, memory_mib) * units.MILLI_PER_GPU)
            out.append((gpus * units.ge(milli, weight), _("%(gpus)d × vGPU %(memory)d GiB / %(cores)d%%") % {
                "gpus": gpus, "memory": memory // 1024, "cores": cores}))
    elif mode == SharingMode.EXCLUSIVE and gpus < held_gpus:
        out.append((gpus * units.ge(units.MILLI_PER_GPU, weight), _("%(gpus)d whole GPU(s)") % {"gpus": gpus}))
    return out


def advice(*, teams: QuerySet[Team], user=None, n: int | None = None) -> list[Advice]:
    """Suggestions for each of `teams` (from the last `n` ended bookings of each, those of `user` only when
    given), largest saving first."""
    n = n or settings.ADVICE_RESERVATIONS
    weights = model_weights()
    out: list[Advice] = []
    for team in teams:
        ended = Reservation.objects.filter(team=team, state__in=(Reservation.State.RELEASED, Reservation.State.EXPIRED),
                                           ended_at__isnull=False).select_related("pool")
        if user is not None:
            ended = ended.filter(requested_by=user)
        last = list(ended.order_by("-ended_at", "-id")[:n])
        if not last:
            continue
        out += _team_advice(team, user, last, weights)
    return sorted(out, key=lambda a: -a.ge_hours_saved_per_month)


def _team_advice(team: Team, user, last: list[Reservation], weights) -> list[Advice]:
    grants: dict[int, list[tuple]] = defaultdict(list)
    for row in (Allocation.objects.filter(reservation_id__in=[r.pk for r in last], ends_at__gt=F("starts_at"))
                .values_list("reservation_id", "gpu_id", "starts_at", "ends_at", "mode", "milli", "memory_mib",
                             "gpu__memory_mib", "gpu__model_name", "reservation__pool__sharing_config")):
        reservation_id, gpu_id, s, e, mode, milli, cap, gpu_memory, model, config = row
        grants[reservation_id].append((gpu_id, s, e, mode, milli, cap, gpu_memory, model, replicas_of(config)))
    groups: dict[tuple, list[tuple[Reservation, Held]]] = defaultdict(list)
    rollups = _rollups([grant for rows in grants.values() for grant in rows])
    for r in last:
        held = _held(r, grants.get(r.pk, []), rollups)
        if held is not None:
            groups[(r.pool_id, r.mode, r.gpus, r.shares, r.mig_profile, r.mig_count, r.gpu_memory_mib,
                    r.gpu_cores_pct, held.model)].append((r, held))
    pools = list(GpuPool.objects.filter(pk__in=Quota.objects.filter(team=team).values("pool_id")))
    card_memory = dict(Gpu.objects.filter(pool__in=pools).values_list("model_name", "memory_mib").distinct())
    models_of: dict[int, set[str]] = defaultdict(set)
    for pool_id, model in Gpu.objects.filter(pool__in=pools).values_list("pool_id", "model_name").distinct():
        models_of[pool_id].add(model)
    out = []
    for key, members in groups.items():
        if len(members) < MIN_RESERVATIONS:
            continue
        model = key[-1]
        helds = [h for _r, h in members]
        peak = max(h.peak_memory_mib for h in helds)
        p95 = max(h.p95_util for h in helds)
        busy = max(1, max(h.busy_gpus for h in helds))
        held_ge = sum(h.ge for h in helds) / len(helds)
        need_mib, need_compute = peak * HEADROOM, max(0.01, p95 / 100 * HEADROOM)
        weight = float(weight_of(weights, model))
        memory = card_memory.get(model) or max(h.memory_mib for h in helds)
        offers = []
        for pool in pools:
            if model in models_of[pool.pk]:
                offers += [(ge, words, pool) for ge, words in _offers(pool, model, memory, weight, need_mib,
                                                                     need_compute, busy, helds[0].gpus)]
        if not offers:
            continue
        ge, words, target = min(offers, key=lambda o: (o[0], o[2].pk != key[0]))
        if ge > FAR_BELOW * held_ge:
            continue
        span_days = max(1.0, (max(h.ended for h in helds) - min(h.started for h in helds)).total_seconds() / 86400)
        booked = sum(h.ge * h.hours for h in helds) / span_days * DAYS_PER_MONTH
        first = members[0][0]
        out.append(Advice(
            team=team.slug, user=getattr(user, "username", None), pool=first.pool.slug, held=_shape_words(first),
            held_ge=round(held_ge, 3), reservations=len(members), peak_memory_mib=peak,
            held_memory_mib=max(h.memory_mib for h in helds), p95_util_pct=round(p95, 1), busy_gpus=busy,
            gpu_model=model, suggest_pool=target.slug, suggest_mode=target.sharing_mode, suggest=words,
            suggest_ge=round(ge, 3), ge_hours_booked_per_month=round(booked, 1),
            ge_hours_saved_per_month=round(booked * (1 - ge / held_ge), 1) if held_ge else 0.0,
            reservation_ids=[r.pk for r, _h in members]))
    return out


def advice_for_reservation(reservation: Reservation) -> list[Advice]:
    """The team's advice for bookings like this one (same pool and shape), for its page."""
    if reservation.team_id is None:
        return []
    found = advice(teams=Team.objects.filter(pk=reservation.team_id))
    return [a for a in found if a.pool == reservation.pool.slug and a.held == _shape_words(reservation)]
