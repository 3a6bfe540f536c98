"""A pool's usual work, as the placement engine's fragmentation-aware policies weigh it.

`portal` and `fgd` score a placement by what it leaves for the work that usually comes
(placement.WorkloadProfile: the typical shapes, the fractional sizes that fill remnants, and per
GPU model the work tied to it). Without a profile they assume a neutral mix of whole GPUs, halves
and quarters that may run on any model. `pool_profile` builds the pool's own from its most recent
reservations: their shapes in the pool's unit and the GPU models they accept (`gpu_models`), so
a pool where most work asks for "H100 only" is scored knowing that its H100s are the contended
ones.

Reservations book GPUs only: no node's CPU or memory is ever held by them. Each demand therefore
brings the neutral mix's CPU and memory per GPU (12 cores and 48 GiB a GPU, placement.workload)
rather than none, so the CPU and memory terms weigh as they did and only the shapes and model ties
come from the pool.
"""
from __future__ import annotations

import threading
import time
from collections import Counter
from dataclasses import dataclass

from allocations.placement import PlacementRequest, WorkloadProfile
from allocations.placement.mig import mig_compute_milli
from common import sql
from inventory.sharing import REPLICA_MODES, SharingMode, replicas_of

# The bound: the pool's last PROFILE_RESERVATIONS reservations (by id, newest first; an index on (pool, id)
# makes it one short index scan however long the pool's history). A few hundred are enough to tell the mix,
# and a fixed number keeps the read and the profile's build the same size as the pool ages.
PROFILE_RESERVATIONS = 500
# Fewer than this and the pool has no mix to speak of yet: the engine's neutral default is used.
PROFILE_MIN_RESERVATIONS = 20
# The cache: a profile is read and built at most once per pool and process every PROFILE_TTL_SECONDS, so a
# create pays it once in a while, not every call (the mix of hundreds of bookings does not move in minutes).
# The profile object is kept while the mix stays within PROFILE_DRIFT of the one it was built from (the share
# of the demands that differ: total variation distance), because the policies cache their terms, and
# `portal` its guard's check, per profile object: a new object pays them again in the create that first
# uses it (about a second of CPU on a pool of 250 eight-GPU nodes: benchmarks.profile_guard). Each new reservation
# moves a 500-reservation mix by 0.2 %, so comparing exactly would rebuild it nearly every
# PROFILE_TTL_SECONDS in a busy pool; 5 % rebuilds it when the work has really changed.
PROFILE_TTL_SECONDS = 300.0
PROFILE_RESOLUTION = 1000  # the mix compared in thousandths of the demands
PROFILE_DRIFT = 0.05
# A request of many instances or GPUs counts as at most this many demands (one giant request does not make
# the mix).
_MOST_PER_REQUEST = 8
# The neutral mix's CPU (millicores) and memory (MiB) per milli-GPU (placement.workload's default).
_CPU_PER_MILLI = 12
_MEMORY_PER_MILLI = 48


@dataclass
class _Cached:
    expires: float
    mix: tuple
    profile: WorkloadProfile | None


_cache: dict[int, _Cached] = {}
_lock = threading.Lock()


def forget() -> None:
    """Drop every cached profile (tests; a process that wants the next create to read afresh)."""
    with _lock:
        _cache.clear()


def pool_profile(pool_id: int) -> WorkloadProfile | None:
    """The pool's profile (None: fewer than PROFILE_MIN_RESERVATIONS, the engine's default mix), from the
    cache while fresh, else read (one query) and built."""
    now = time.monotonic()
    cached = _cache.get(pool_id)
    if cached is not None and cached.expires > now:
        return cached.profile
    mix = _mix(_demands(pool_id))
    if cached is not None and bool(cached.mix) == bool(mix) and _drift(cached.mix, mix) <= PROFILE_DRIFT:
        # Much the same work: keep the object, and what the policies cached on it, and the mix it was built from
        # (so that slow drift adds up until it crosses PROFILE_DRIFT).
        mix, profile = cached.mix, cached.profile
    else:
        profile = _profile_of(mix)
    with _lock:
        _cache[pool_id] = _Cached(expires=now + PROFILE_TTL_SECONDS, mix=mix, profile=profile)
    return profile


def _drift(old: tuple, new: tuple) -> float:
    """The share of the demands in which two mixes differ (total variation distance, 0 to 1)."""
    before, after = dict(old), dict(new)
    return sum(abs(before.get(d, 0) - after.get(d, 0)) for d in before.keys() | after.keys()) / (
        2 * PROFILE_RESOLUTION)


@dataclass(frozen=True, order=True)
class _Demand:
    """One kind of the pool's work: whole GPUs, a milli-GPU share or a MIG profile, and the models it accepts
    (hashable and ordered, which a PlacementRequest is not)."""

    gpus: int = 0
    milli: int = 0
    mig_profile: str = ""
    allowed: tuple[str, ...] = ()

    def request(self) -> PlacementRequest:
        models = frozenset(self.allowed)
        if self.mig_profile:
            milli = mig_compute_milli(self.mig_profile)
            return _with_resources(milli, mig_profile=self.mig_profile, allowed_models=models)
        if self.milli:
            return _with_resources(self.milli, milli=self.milli, allowed_models=models)
        return _with_resources(1000 * self.gpus, gpus=self.gpus, allowed_models=models)


def _demands(pool_id: int) -> Counter:
    """The pool's last PROFILE_RESERVATIONS reservations as demands, counted."""
    rows = sql.fetch_all(
        "SELECT r.mode, r.gpus, r.shares, r.mig_profile, r.mig_count, r.gpu_cores_pct, r.gpu_models, "
        "p.sharing_config FROM allocations_reservation r JOIN inventory_gpupool p ON p.id = r.pool_id "
        "WHERE r.pool_id = %s ORDER BY r.id DESC LIMIT %s", [pool_id, PROFILE_RESERVATIONS])
    counted: Counter = Counter()
    for mode, gpus, shares, mig_profile, mig_count, cores_pct, models, config in rows:
        allowed = tuple(sorted(sql.json_value(models) or ()))
        demand, times = _demand_of(mode, gpus or 1, shares or 1, mig_profile, mig_count or 1, cores_pct,
                                   replicas_of(sql.json_value(config) or {}) or 1, allowed)
        if demand is not None:
            counted[demand] += min(times, _MOST_PER_REQUEST)
    return counted


def _with_resources(milli: int, **kwargs) -> PlacementRequest:
    return PlacementRequest(cpu_milli=_CPU_PER_MILLI * milli, memory_mib=_MEMORY_PER_MILLI * milli, **kwargs)


def _demand_of(mode: str, gpus: int, shares: int, mig_profile: str, mig_count: int, cores_pct: int | None,
               replicas: int, allowed: tuple[str, ...]) -> tuple[_Demand | None, int]:
    """A reservation as the engine's demand (and how many of it): whole GPUs; a share as its milli-GPU (the
    pool's replicas now); each MIG instance; each vGPU share by its cores."""
    if mode in REPLICA_MODES:
        milli = shares * (1000 // replicas)
        return (_Demand(gpus=1, allowed=allowed) if milli >= 1000 else _Demand(milli=milli, allowed=allowed)), 1
    if mode == SharingMode.MIG:
        if not mig_profile or not mig_compute_milli(mig_profile):
            return None, 0
        return _Demand(mig_profile=mig_profile, allowed=allowed), mig_count
    if mode == SharingMode.VGPU:
        milli = 10 * (cores_pct or 100)
        return (_Demand(gpus=1, allowed=allowed) if milli >= 1000 else _Demand(milli=milli, allowed=allowed)), gpus
    return _Demand(gpus=gpus, allowed=allowed), 1


def _mix(counted: Counter) -> tuple:
    """The demands as a comparable mix: each with its share in PROFILE_RESOLUTION-ths (rare ones that round to
    nothing are left out), sorted; () when there are fewer than PROFILE_MIN_RESERVATIONS."""
    total = sum(counted.values())
    if total < PROFILE_MIN_RESERVATIONS:
        return ()
    shares = ((demand, round(PROFILE_RESOLUTION * count / total)) for demand, count in counted.items())
    return tuple(sorted((d, share) for d, share in shares if share > 0))


def _profile_of(mix: tuple) -> WorkloadProfile | None:
    if not mix:
        return None
    return WorkloadProfile.from_requests(demand.request() for demand, share in mix for _ in range(share))
