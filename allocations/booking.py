"""Booking: the one path from "this team wants GPUs of this pool for this window" to grants.

Create, extend and failover (and the queue next) all go through it, in three steps:

1. `pool_snapshot`: the pool's GPUs and every grant that overlaps the window, each with its
   own window and share, read under the caller's lock on the pool row;
2. the placement engine (`allocations/placement/`, no Django) decides on that snapshot with
   the pool's policy: `choose_whole_gpus` for a new booking, `first_clash` for more time on
   the GPUs a reservation already holds;
3. `grants_write` writes one grant per GPU.

The snapshot keeps what the engine understands (time windows, milli-GPU shares, MIG
instances), so a GPU booked for part of the window is busy for exactly that part and a
shared GPU counts only what its grants hold.
"""
from __future__ import annotations

import logging
import math
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime

import numpy as np
from django.utils.translation import gettext_noop

from allocations import profiles, units
from allocations.messages import Msg
from allocations.placement import mig
from allocations.placement import (
    DEFAULT_POLICY,
    POLICY_NAMES,
    ClusterState,
    GpuInfo,
    Holding,
    NodeInfo,
    PlacementRequest,
    WorkloadProfile,
    place,
)
from allocations.placement.api import WindowPlacer
from allocations.models import AllocationQuerySet
from common import sql
from inventory.sharing import REPLICA_MODES, SharingMode, mig_dynamic, mig_layout_names, replicas_of

log = logging.getLogger(__name__)

# A node whose CPU or memory capacity is unknown (0 in inventory) must not look starved to
# the policies that weigh CPU and memory, so it gets this much instead.
_UNKNOWN_CAPACITY = 10**9


@dataclass(frozen=True)
class PoolGpu:
    """One GPU of the pool, as the booking sees it."""

    id: int
    node_id: int
    node_name: str
    index: int
    uuid: str = ""
    model: str = ""
    memory_mib: int = 0
    usable: bool = True  # a healthy GPU on a healthy, schedulable node
    node_cpu_milli: int = 0
    node_memory_mib: int = 0
    weight: float = 1.0  # GE of the whole card (inventory.GpuModel; 1.0 for a model without a row)
    mig_devices: tuple = ()


@dataclass(frozen=True)
class Grant:
    """A grant that overlaps the snapshot's window: what another reservation holds of a GPU, and when."""

    gpu_id: int
    reservation_id: int
    starts_at: datetime
    ends_at: datetime
    milli: int = units.MILLI_PER_GPU
    mig_profile: str = ""
    mig_start: int | None = None
    mode: str = SharingMode.EXCLUSIVE
    share_from: int = 0
    share_to: int = units.MILLI_PER_GPU
    memory_mib: int | None = None
    cores_pct: int | None = None

    @property
    def is_vgpu(self) -> bool:
        return self.mode == SharingMode.VGPU

    def ending_at(self, at: datetime) -> Grant:
        """This grant ending at `at`: dataclasses.replace without its per-field round trip (the queue's
        estimate moves the end of every grant of the pool, thousands a pass)."""
        twin = object.__new__(Grant)
        twin.__dict__.update(self.__dict__)
        twin.__dict__["ends_at"] = at
        return twin


class BookingRefused(Exception):
    """No set of GPUs satisfies the request; `code` is machine-readable, `msg` is for people (`message`:
    in the active language)."""

    def __init__(self, code: str, msg: Msg) -> None:
        super().__init__(msg.english())
        self.code = code
        self.msg = msg

    @property
    def message(self) -> str:
        return str(self.msg)


# The placement engine (allocations.placement, no Django) explains a refusal in English with a code and
# its numbers (placement.reasons): here, at its boundary, each becomes a message people read in their
# language. Where the numbers give back the engine's sentence exactly, the message is that sentence;
# else the engine's English is kept and other languages read a summary for its code.
_ENGINE_EXACT = {
    ("insufficient_capacity", frozenset({"requested", "free"})): lambda d: Msg.plural(
        gettext_noop("%(requested)d GPU requested but only %(free)d are free for the whole window."),
        gettext_noop("%(requested)d GPUs requested but only %(free)d are free for the whole window."),
        "requested", requested=d["requested"], free=d["free"]),
    ("insufficient_capacity", frozenset({"requested_milli", "free_milli"})): lambda d: Msg(
        gettext_noop("%(requested_milli)d milli-GPU requested but only %(free_milli)d are free for the whole "
                     "window."), requested_milli=d["requested_milli"], free_milli=d["free_milli"]),
    ("fragmented", frozenset({"requested", "free", "most_on_one_node"})): lambda d: Msg(
        gettext_noop("%(free)d GPUs are free in total but no node has %(requested)d free (the most on one node "
                     "is %(most)d)."), free=d["free"], requested=d["requested"], most=d["most_on_one_node"]),
    ("fragmented", frozenset({"requested_milli", "free_milli", "most_on_one_gpu"})): lambda d: Msg(
        gettext_noop("%(free_milli)d milli-GPU are free in total but no single GPU has %(requested_milli)d free "
                     "(the most on one GPU is %(most)d)."), free_milli=d["free_milli"],
        requested_milli=d["requested_milli"], most=d["most_on_one_gpu"]),
}
_ENGINE_SUMMARY = {
    "invalid_request": gettext_noop("The request is not valid for this pool."),
    "over_quota": gettext_noop("The request needs more quota than the team has left."),
    "no_matching_nodes": gettext_noop("No healthy, schedulable node can take it."),
    "no_gpu_model": gettext_noop("No GPU of the models it allows is in the pool."),
    "too_large": gettext_noop("More GPUs requested on one node than the largest node has."),
    "insufficient_capacity": gettext_noop("Not enough of the pool is free for the whole window."),
    "fragmented": gettext_noop("Enough is free in total, but not together on one GPU or node."),
    "cpu_memory": gettext_noop("No node with room for it also has the CPU cores and memory it needs free."),
    "no_mig_profile": gettext_noop("No MIG-capable GPU in the pool offers that MIG profile."),
    "mig_fragmented": gettext_noop("MIG slices are free, but no GPU has a free legal start for that profile."),
}


def engine_msg(code: str, message: str, details=None) -> Msg:
    """The engine's refusal (code, English message, details) as a message people read in their language."""
    details = dict(details or {})
    exact = _ENGINE_EXACT.get((code, frozenset(details)))
    if exact is not None:
        try:
            msg = exact(details)
            if msg.english() == message:
                return msg
        except (KeyError, TypeError, ValueError):
            pass
    return Msg.summary(_ENGINE_SUMMARY.get(code, gettext_noop("The request could not be placed.")), message)


@dataclass(frozen=True)
class PoolSnapshot:
    """A pool for the window [start, end): its GPUs (in a stable node order) and the grants overlapping it."""

    start: datetime
    end: datetime
    gpus: tuple[PoolGpu, ...]
    grants: tuple[Grant, ...]
    # The pool's usual work (allocations.profiles.pool_profile), for the policies that weigh it; None: the
    # engine's neutral default mix.
    profile: WorkloadProfile | None = None
    # (grants, starts, ends): the grants' windows as whole microseconds since the epoch (int64 columns in their
    # order), where pool_snapshot read them so (PostgreSQL), for the queue's plan, which counts in them; the
    # grants they belong to come first because dataclasses.replace keeps this while it changes `grants`, so a
    # reader checks that it is this snapshot's `grants` (`grant_micros_of`).
    grant_micros: tuple | None = field(default=None, compare=False, repr=False)

    def grant_micros_of(self) -> tuple[np.ndarray, np.ndarray] | None:
        """The grants' (starts, ends) as micros where the read kept them, else None."""
        kept = self.grant_micros
        return (kept[1], kept[2]) if kept is not None and kept[0] is self.grants else None

    def state(self, extra_holdings: Sequence[Holding] = (), *, mig_capable: bool = False) -> ClusterState:
        """The snapshot as the placement engine takes it (plus `extra_holdings`, e.g. what a share
        layout leaves unusable). `mig_capable`: the MIG-capable models' GPUs may be carved by the engine
        (a dynamic MIG pool)."""
        node_of = {gpu.id: gpu.node_id for gpu in self.gpus}
        return ClusterState(
            nodes=engine_nodes(self.gpus, mig_capable=mig_capable),
            holdings=[*(_holding(grant, node_of[grant.gpu_id]) for grant in self.grants if grant.gpu_id in node_of),
                      *extra_holdings],
        )

    def of_models(self, models: Iterable[str]) -> PoolSnapshot:
        """The snapshot cut to the GPUs of `models` (itself when `models` is empty: any model), with only the
        grants on those GPUs. Every chooser then counts and places on these GPUs alone, so a request that
        accepts only some models can never be given, promised or counted room on another one."""
        allowed = frozenset(models)
        if not allowed:
            return self
        gpus = tuple(gpu for gpu in self.gpus if gpu.model in allowed)
        kept = {gpu.id for gpu in gpus}
        return PoolSnapshot(start=self.start, end=self.end, gpus=gpus,
                            grants=tuple(grant for grant in self.grants if grant.gpu_id in kept), profile=self.profile)

    def whole_gpus_free(self, state: ClusterState | None = None) -> list[PoolGpu]:
        """The usable GPUs with the whole card free for all of the window, by the engine's own arithmetic."""
        state = state or self.state()
        arrays = state.arrays_for_window(self.start, self.end)
        free = []
        for gpu in self.gpus:
            node, slot = state.gpu_slot(gpu.id)
            if gpu.usable and arrays.gpu_free[node, slot] >= units.MILLI_PER_GPU:
                free.append(gpu)
        return free


def engine_nodes(gpus: Sequence[PoolGpu], *, mig_capable: bool = False) -> list[NodeInfo]:
    """The pool's nodes as the engine takes them, in the order of their first GPU in `gpus`. `mig_capable`:
    the MIG-capable models' GPUs may be carved by the engine (a dynamic MIG pool)."""
    nodes: dict[int, list[PoolGpu]] = defaultdict(list)
    for gpu in gpus:
        nodes[gpu.node_id].append(gpu)
    return [NodeInfo(
        id=node_id,
        cpu_milli=node_gpus[0].node_cpu_milli or _UNKNOWN_CAPACITY,
        memory_mib=node_gpus[0].node_memory_mib or _UNKNOWN_CAPACITY,
        gpus=tuple(GpuInfo(id=g.id, index=g.index, model=g.model or "unknown", memory_mib=g.memory_mib,
                           healthy=g.usable, mig_capable=mig_capable and bool(mig.profiles_for(g.model)))
                   for g in node_gpus),
    ) for node_id, node_gpus in nodes.items()]


def _holding(grant: Grant, node_id: int) -> Holding:
    """A grant as the engine counts it: a vgpu grant holds cores (as milli) and memory; a MIG instance
    its slices; anything else its milli-GPU."""
    common = dict(node_id=node_id, gpu_id=grant.gpu_id, start=grant.starts_at, end=grant.ends_at,
                  reservation_id=grant.reservation_id)
    if grant.is_vgpu:
        return Holding(**common, milli=min(units.MILLI_PER_GPU, 10 * (grant.cores_pct or 0)),
                       gpu_memory_mib=grant.memory_mib or 0)
    if grant.mig_profile:
        return Holding(**common, mig_profile=grant.mig_profile, mig_start=grant.mig_start)
    return Holding(**common, milli=grant.milli)


def pool_snapshot(pool_id: int, start: datetime, end: datetime, *,
                  without_reservation: int | None = None) -> PoolSnapshot:
    """Read the pool for [start, end) (the caller holds the pool's row lock). `without_reservation`
    leaves that reservation's own grants out (an extension asks whether its GPUs stay free).
    Two hand-written queries: every create runs them. The pool's workload profile comes with it
    (profiles.pool_profile: cached, a third query once in a while)."""
    gpu_rows = sql.fetch_all(
        'SELECT g.id, g.node_id, n.name, g."index", g.uuid, g.model_name, g.memory_mib, '
        "g.healthy AND n.healthy AND n.schedulable, "  # GpuQuerySet.USABLE, by hand
        "n.cpu_milli, n.memory_mib, m.weight, g.mig_devices "
        "FROM inventory_gpu g JOIN inventory_node n ON n.id = g.node_id "
        "LEFT JOIN inventory_gpumodel m ON m.name = g.model_name "
        'WHERE g.pool_id = %s ORDER BY n.name, g.node_id, g."index"',
        [pool_id],
    )
    grant_query = (
        f"SELECT a.gpu_id, a.reservation_id, {sql.instant_column('a.starts_at')}, {sql.instant_column('a.ends_at')}, "
        "a.milli, a.mig_profile, a.mig_start, a.mode, "
        "a.share_from, a.share_to, a.memory_mib, a.cores_pct "
        "FROM allocations_allocation a "
        f"WHERE {sql.in_select('a.gpu_id', 'SELECT g.id FROM inventory_gpu g WHERE g.pool_id = %s')} "
        f"AND {AllocationQuerySet.BOOKED_DURING_SQL}")
    params = [pool_id, sql.db_datetime(end), sql.db_datetime(start)]
    if without_reservation is not None:
        grant_query += " AND a.reservation_id <> %s"
        params.append(without_reservation)
    grant_rows = sql.fetch_all(grant_query, params)
    grants = tuple(map(_grant, grant_rows))
    micros = None
    if not grant_rows or isinstance(grant_rows[0][2], int):
        # sql.instant_column read them as micros (PostgreSQL: every row, as the first): kept so, the queue's plan
        # need not count them again.
        micros = (grants, np.array([row[2] for row in grant_rows], dtype=np.int64),
                  np.array([row[3] for row in grant_rows], dtype=np.int64))
    return PoolSnapshot(
        start=start, end=end,
        gpus=_pool_gpus(pool_id, gpu_rows),
        grants=grants,
        profile=profiles.pool_profile(pool_id),
        grant_micros=micros,
    )


_gpus_of_pool: dict[int, tuple[list[tuple], tuple[PoolGpu, ...]]] = {}  # per pool: its last GPU rows, their PoolGpus


def _pool_gpus(pool_id: int, rows: list[tuple]) -> tuple[PoolGpu, ...]:
    """The pool's PoolGpus for its GPU rows: the same tuple as last time while the rows read the same (one list
    comparison, in C), else _pool_gpu of each. A pool's GPUs rarely change between two reads, and a thousand
    nodes' 6,212 rows looked up one by one were a tenth of reading the pool for a queue pass."""
    kept = _gpus_of_pool.get(pool_id)
    if kept is not None and kept[0] == rows:
        return kept[1]
    gpus = tuple(_pool_gpu(row) for row in rows)
    _gpus_of_pool[pool_id] = (rows, gpus)
    return gpus


_GRANTS_KEPT = 200_000
_grant_of_row: dict[tuple, Grant] = {}


def _grant(row: tuple) -> Grant:
    """The Grant of a row of pool_snapshot's grant query, the same object for the same row while it reads the same
    (as _pool_gpu does: Grant is immutable): a pool's bookings change a few at a time, and a queue pass on a
    thousand nodes built 6,212 of them anew, with their datetimes, each time it read the pool."""
    grant = _grant_of_row.get(row)
    if grant is None:
        gpu_id, rid, start, end, milli, mig_profile, mig_start, mode, share_from, share_to, memory, cores = row
        grant = Grant(gpu_id=gpu_id, reservation_id=rid, starts_at=sql.instant(start), ends_at=sql.instant(end),
                      milli=milli, mig_profile=mig_profile, mig_start=mig_start, mode=mode, share_from=share_from,
                      share_to=share_to, memory_mib=memory, cores_pct=cores)
        if len(_grant_of_row) >= _GRANTS_KEPT:
            _grant_of_row.clear()
        _grant_of_row[row] = grant
    return grant


_GPUS_KEPT = 100_000
_gpu_of_row: dict[tuple, PoolGpu] = {}


def _pool_gpu(row: tuple) -> PoolGpu:
    """The PoolGpu of a row of pool_snapshot's GPU query, the same object for the same row while it reads the
    same (PoolGpu is immutable): a pool's GPUs rarely change, and building thousands of them was a fifth of a
    queue pass on a thousand nodes."""
    try:
        gpu = _gpu_of_row.get(row)
    except TypeError:  # a driver that decodes the JSON column gives a list: no key, build it each time
        return _new_pool_gpu(*row)
    if gpu is None:
        gpu = _new_pool_gpu(*row)
        if len(_gpu_of_row) >= _GPUS_KEPT:
            _gpu_of_row.clear()
        _gpu_of_row[row] = gpu
    return gpu


def _new_pool_gpu(gpu_id, node_id, node_name, index, uuid, model, memory, usable, cpu, node_memory, weight,
                  devices) -> PoolGpu:
    return PoolGpu(id=gpu_id, node_id=node_id, node_name=node_name, index=index, uuid=uuid, model=model,
                   memory_mib=memory, usable=bool(usable), node_cpu_milli=cpu, node_memory_mib=node_memory,
                   weight=1.0 if weight is None else float(weight),
                   mig_devices=tuple(sql.json_value(devices) or ()) if devices not in (None, "[]") else ())


def policy_name(name: str | None) -> str:
    """The engine policy for a pool's `placement_policy` (empty or unknown names get the default).

    The API only accepts known names; this guards rows written some other way (admin, SQL)."""
    if name in POLICY_NAMES:
        return name
    if name:
        log.warning("unknown placement policy %r; using %s", name, DEFAULT_POLICY)
    return DEFAULT_POLICY


def choose_whole_gpus(snapshot: PoolSnapshot, count: int, *, policy: str = DEFAULT_POLICY,
                      state: ClusterState | None = None, free: Sequence[PoolGpu] | None = None,
                      most_per_node: int | None = None, gpu_models: Iterable[str] = (),
                      profile: WorkloadProfile | None = None, placer: WindowPlacer | None = None) -> list[int]:
    """Pick `count` GPUs whose whole card is free for the snapshot's window.

    A request that fits on one node of the pool (count <= the most usable GPUs any node has)
    is placed on one node, because multi-GPU jobs want NVLink/PCIe locality; the engine
    picks the node and GPUs with the pool's policy, so the remnants stay usable. A larger
    request takes whole nodes, the emptiest first, to touch as few nodes as possible.
    `state`: the snapshot's GPUs with what holds them, built already (the queue's plan keeps
    one for all its windows); else built from the snapshot's grants. `free` (whole_gpus_free's answer)
    and `most_per_node` (most_usable_on_a_node's): where the caller knows them already. `gpu_models`: the
    models the request accepts (the engine is told too, so its policy scores the demand as tied to them);
    `profile`: the pool's usual work, for the policies that weigh it (pool_profile). With `gpu_models`, only
    their GPUs count as free and make a node's room, and the engine sees the whole pool (its policy weighs
    what the choice leaves on every model) but may place only on them. `placer`: places in `state` as place()
    does, window after window, rescoring only the nodes that changed (the queue's plan keeps one per board).
    """
    state = state or snapshot.state()
    free = free if free is not None else snapshot.whole_gpus_free(state)
    allowed = frozenset(gpu_models)
    if allowed:
        free = [gpu for gpu in free if gpu.model in allowed]
        if most_per_node is None:
            most_per_node = most_usable_on_a_node([gpu for gpu in snapshot.gpus if gpu.model in allowed])
    if len(free) < count:
        raise BookingRefused("insufficient_capacity", Msg(
            gettext_noop("%(requested)d GPUs requested but only %(free)d are free for the whole window."),
            requested=count, free=len(free)))
    if count <= (most_per_node if most_per_node is not None else most_usable_on_a_node(snapshot.gpus)):
        request = whole_gpu_request(count, snapshot.start, snapshot.end, allowed)
        decision = (placer.place(request, policy_name(policy), profile=profile) if placer is not None
                    else place(state, request, policy_name(policy), profile=profile))
        if not decision.ok:
            first = decision.reasons[0]
            raise BookingRefused(decision.code, engine_msg(first.code, first.message, first.details))
        return [assignment.gpu_id for assignment in decision.gpus]
    return _whole_nodes(free, count)


def whole_gpu_request(count: int, start: datetime | float, end: datetime | float,
                      gpu_models: Iterable[str] = ()) -> PlacementRequest:
    """What choose_whole_gpus asks the engine for `count` whole GPUs on one node over [start, end) (the queue's
    board asks the engine's fit for the same request: queue.PoolFrame.whole_fit)."""
    return PlacementRequest(gpus=count, start=start, end=end, allowed_models=frozenset(gpu_models))


def most_usable_on_a_node(gpus: Sequence[PoolGpu]) -> int:
    """The most usable GPUs one node of `gpus` has."""
    usable_per_node: dict[int, int] = defaultdict(int)
    for gpu in gpus:
        usable_per_node[gpu.node_id] += gpu.usable
    return max(usable_per_node.values(), default=0)


def _whole_nodes(free: Iterable[PoolGpu], count: int) -> list[int]:
    by_node: dict[int, list[PoolGpu]] = defaultdict(list)
    for gpu in free:
        by_node[gpu.node_id].append(gpu)
    chosen: list[int] = []
    for node_gpus in sorted(by_node.values(), key=lambda g: (-len(g), g[0].node_name, g[0].node_id)):
        chosen.extend(gpu.id for gpu in sorted(node_gpus, key=lambda g: g.index)[: count - len(chosen)])
        if len(chosen) == count:
            break
    return chosen


# --- what a reservation asks for, and the grants that give it ---------------------------------

@dataclass(frozen=True)
class Shape:
    """A request in its pool's unit, already checked against the pool by the service.

    exclusive: `gpus` whole GPUs. time_slicing, mps: `shares` of a GPU offered as `replicas`.
    mig: `mig_count` instances of `mig_profile`, on GPUs carved as `mig_layout` (a layout name or
    one GPU's profile names). vgpu: on each of `gpus` GPUs of one node, `memory_mib` (or
    `memory_pct` of the card) and `cores_pct`.
    """

    mode: str = SharingMode.EXCLUSIVE
    gpus: int = 1
    shares: int = 0
    replicas: int = 0
    mig_profile: str = ""
    mig_count: int = 0
    mig_layout: str | tuple[str, ...] = ()
    mig_dynamic: bool = False  # the pool carves its GPUs on demand (mig_layout is then only the idle layout)
    memory_mib: int = 0
    memory_pct: int = 0
    cores_pct: int = 0
    # The GPU models it accepts (Gpu.model_name), sorted; empty: any model of the pool. choose and room count
    # only the GPUs of these models (PoolSnapshot.of_models; whole GPUs: choose_whole_gpus's gpu_models).
    gpu_models: tuple[str, ...] = ()

    def in_words(self) -> Msg:
        """The request in its own unit, for messages: "4 × 3g.40gb", "3 of 4 shares", ... (str() of it:
        in the active language), with the models it accepts where it names them."""
        amount = self._amount_words()
        if self.gpu_models:
            return Msg(gettext_noop("%(amount)s of %(models)s"), amount=amount, models=models_words(self.gpu_models))
        return amount

    def _amount_words(self) -> Msg:
        if self.mode in REPLICA_MODES:
            return Msg(gettext_noop("%(shares)d of %(replicas)d shares of a GPU"), shares=self.shares,
                       replicas=self.replicas)
        if self.mode == SharingMode.MIG:
            return Msg(gettext_noop("%(count)d × %(profile)s"), count=self.mig_count, profile=self.mig_profile)
        if self.mode == SharingMode.VGPU:
            return Msg(gettext_noop("%(memory)s and %(cores)d %% of the cores on each of %(gpus)s"),
                       memory=self.memory_words(), cores=self.cores_pct, gpus=gpus_words(self.gpus))
        return gpus_words(self.gpus)

    def memory_words(self) -> Msg:
        if self.memory_mib:
            return Msg(gettext_noop("%(mib)d MiB"), mib=self.memory_mib)
        return Msg(gettext_noop("%(pct)d %% of the memory"), pct=self.memory_pct)


def models_words(models: Sequence[str]) -> str:
    """GPU models as a message names them: "NVIDIA A100-SXM4-80GB / NVIDIA H100 80GB HBM3" (model names are
    not translated; a slash rather than a word, so that it reads the same in every language)."""
    return " / ".join(models)


def gpus_words(count: int) -> Msg:
    return Msg.plural(gettext_noop("%(count)d GPU"), gettext_noop("%(count)d GPUs"), "count", count=count)


def shape_of(reservation, pool) -> Shape:
    """What a booked reservation holds, as a Shape (failover places it again), with the models it accepts."""
    config = pool.sharing_config or {}
    models = tuple(sorted(reservation.gpu_models or ()))
    if reservation.mode in REPLICA_MODES:
        return Shape(mode=reservation.mode, shares=reservation.shares or 1, replicas=replicas_of(config) or 1,
                     gpu_models=models)
    if reservation.mode == SharingMode.MIG:
        return Shape(mode=reservation.mode, mig_profile=reservation.mig_profile, mig_count=reservation.mig_count or 1,
                     mig_layout=mig_layout_names(config), mig_dynamic=mig_dynamic(config), gpu_models=models)
    if reservation.mode == SharingMode.VGPU:
        return Shape(mode=reservation.mode, gpus=reservation.gpus, memory_mib=reservation.gpu_memory_mib or 0,
                     cores_pct=reservation.gpu_cores_pct or 100, gpu_models=models)
    return Shape(gpus=reservation.gpus, gpu_models=models)


@dataclass(frozen=True)
class NewGrant:
    """A grant about to be written: one GPU (or a part of one) for the reservation's window."""

    gpu_id: int
    ge: float
    mode: str = SharingMode.EXCLUSIVE
    share_from: int = 0
    share_to: int = units.MILLI_PER_GPU
    milli: int = units.MILLI_PER_GPU
    mig_profile: str = ""
    mig_start: int | None = None
    memory_mib: int | None = None
    cores_pct: int | None = None


def choose(snapshot: PoolSnapshot, shape: Shape, *, policy: str = DEFAULT_POLICY) -> list[NewGrant]:
    """The grants that give `shape` for the snapshot's window, or BookingRefused with the reason in the
    request's own unit. A shape that accepts only some models is chosen among their GPUs alone; a refusal
    then says so (code `no_gpu_model`, where the room was short, not only scattered)."""
    if not shape.gpu_models:
        return _choose(snapshot, shape, policy)
    try:
        if shape.mode == SharingMode.EXCLUSIVE:
            # The whole pool to the engine, told the models (the queue's board decides the same way).
            return _choose(snapshot, shape, policy)
        return _choose(snapshot.of_models(shape.gpu_models), shape, policy)
    except BookingRefused as refused:
        raise BookingRefused("no_gpu_model" if refused.code == "insufficient_capacity" else refused.code, Msg(
            gettext_noop("Counting only GPUs of the models it accepts (%(models)s): %(why)s"),
            models=models_words(shape.gpu_models), why=refused.msg)) from None


def _choose(snapshot: PoolSnapshot, shape: Shape, policy: str) -> list[NewGrant]:
    if shape.mode in REPLICA_MODES:
        return _choose_shares(snapshot, shape, policy)
    if shape.mode == SharingMode.MIG:
        return _choose_mig_dynamic(snapshot, shape, policy) if shape.mig_dynamic else _choose_mig(snapshot, shape)
    if shape.mode == SharingMode.VGPU:
        return _choose_vgpu(snapshot, shape, policy)
    weight = {gpu.id: gpu.weight for gpu in snapshot.gpus}
    return [NewGrant(gpu_id=gpu_id, ge=weight[gpu_id])
            for gpu_id in choose_whole_gpus(snapshot, shape.gpus, policy=policy, gpu_models=shape.gpu_models,
                                            profile=snapshot.profile)]


def _busy_parts(snapshot: PoolSnapshot) -> dict[int, list[tuple[int, int]]]:
    """Per GPU, the parts of its share space some grant holds at some instant of the window (a vgpu
    grant holds the whole card as far as the other modes are concerned)."""
    busy: dict[int, list[tuple[int, int]]] = defaultdict(list)
    for grant in snapshot.grants:
        busy[grant.gpu_id].append((0, units.MILLI_PER_GPU) if grant.is_vgpu else (grant.share_from, grant.share_to))
    return busy


def _is_free(part: tuple[int, int], busy: Sequence[tuple[int, int]]) -> bool:
    return all(part[1] <= lo or hi <= part[0] for lo, hi in busy)


def share_slot(index: int, replicas: int) -> tuple[int, int]:
    """Share slot `index` of a GPU offered as `replicas` shares, as a part of its share space
    (units.share_slot_width wide)."""
    width = units.share_slot_width(replicas)
    return index * width, (index + 1) * width


def slot_runs(slots: Sequence[int]) -> list[tuple[int, int]]:
    """Ascending slot indexes as runs of adjacent slots, (first, count) each: a grant row is one run."""
    runs: list[tuple[int, int]] = []
    for index in slots:
        if runs and runs[-1][0] + runs[-1][1] == index:
            runs[-1] = (runs[-1][0], runs[-1][1] + 1)
        else:
            runs.append((index, 1))
    return runs


def _free_share_slots(snapshot: PoolSnapshot, replicas: int) -> dict[int, list[int]]:
    """Per usable GPU, its share slots no grant holds at any instant of the window."""
    busy = _busy_parts(snapshot)
    return {gpu.id: [i for i in range(replicas) if _is_free(share_slot(i, replicas), busy[gpu.id])]
            for gpu in snapshot.gpus if gpu.usable}


def _choose_shares(snapshot: PoolSnapshot, shape: Shape, policy: str) -> list[NewGrant]:
    """k shares of one GPU. The engine picks the GPU with the pool's policy, seeing each share as
    1000 // replicas milli and the unusable rest of each card as held; the shares are the GPU's
    lowest free slots, written as one grant per run of adjacent slots (usually one)."""
    replicas, wanted = shape.replicas, shape.shares
    free_slots = _free_share_slots(snapshot, replicas)
    total = sum(len(slots) for slots in free_slots.values())
    most = max((len(slots) for slots in free_slots.values()), default=0)
    if most < wanted:
        if total >= wanted:
            raise BookingRefused("fragmented", Msg(gettext_noop(
                "fragmented: %(total)d shares are free for that window, but no GPU has %(wanted)d (the most on one "
                "GPU is %(most)d)."), total=total, wanted=wanted, most=most))
        raise BookingRefused("insufficient_capacity", Msg(gettext_noop(
            "%(wanted)d shares requested but only %(total)d are free for that window."), wanted=wanted, total=total))
    width = units.share_slot_width(replicas)
    rest = units.MILLI_PER_GPU - replicas * width
    unusable = [Holding(node_id=gpu.node_id, gpu_id=gpu.id, start=snapshot.start, end=snapshot.end, milli=rest)
                for gpu in snapshot.gpus if rest and gpu.id in free_slots]
    milli = wanted * width
    allowed = frozenset(shape.gpu_models)
    request = (PlacementRequest(milli=milli, start=snapshot.start, end=snapshot.end, allowed_models=allowed)
               if milli < units.MILLI_PER_GPU else
               PlacementRequest(gpus=1, start=snapshot.start, end=snapshot.end, allowed_models=allowed))
    decision = place(snapshot.state(unusable), request, policy_name(policy), profile=snapshot.profile)
    gpu_id = decision.gpus[0].gpu_id if decision.ok else None
    if gpu_id is None or len(free_slots.get(gpu_id, ())) < wanted:
        # The engine counts peak use over time, the slots what any grant holds at some instant of the
        # window: where they differ, take the GPU that has the slots and the fewest left over.
        gpu_id = min((g for g, slots in free_slots.items() if len(slots) >= wanted),
                     key=lambda g: len(free_slots[g]))
    by_id = {gpu.id: gpu for gpu in snapshot.gpus}
    gpu = by_id[gpu_id]
    mps = shape.mode == SharingMode.MPS
    return [NewGrant(gpu_id=gpu_id, ge=gpu.weight * count / replicas, mode=shape.mode,
                     share_from=share_slot(first, replicas)[0], share_to=share_slot(first + count - 1, replicas)[1],
                     milli=width * count, memory_mib=count * (gpu.memory_mib // replicas) if mps else None,
                     cores_pct=count * max(1, 100 // replicas) if mps else None)
            for first, count in slot_runs(free_slots[gpu_id][:wanted])]


MIG_SLICE_MILLI = units.MILLI_PER_GPU // mig.MIG_SLICES  # one memory slice of the share space


def layout_of(model: str, layout: str | Sequence[str]) -> list[tuple[mig.MigProfile, int]]:
    """A MIG pool's layout on a GPU of `model`: its instances as (profile, start slice)."""
    names = mig.named_layout(model, layout) if isinstance(layout, str) else list(layout)
    return mig.layout_instances(model, names)


def layout_offered(model: str, layout: str | Sequence[str]) -> list[tuple[mig.MigProfile, int]]:
    """layout_of, or nothing where the layout does not fit the model: a GPU it cannot carve offers no
    instance (pool writes refuse such a layout; a GPU of another model may join the pool later)."""
    try:
        return layout_of(model, layout)
    except mig.LayoutError:
        return []


def layout_profiles(models: Iterable[str], layout: str | Sequence[str], *, dynamic: bool = False
                    ) -> list[mig.MigProfile]:
    """The profiles a MIG layout offers on GPUs of `models`, smallest first, each name once. A dynamic
    layout offers every profile of the models but the +me ones (one media-engine instance per GPU is a
    rule the slices alone do not keep)."""
    profiles: dict[str, mig.MigProfile] = {}
    for model in sorted(models):
        if dynamic:
            for profile in dynamic_profiles(model):
                profiles.setdefault(profile.name, profile)
            continue
        for profile, _ in layout_offered(model, layout):
            profiles.setdefault(profile.name, profile)
    return sorted(profiles.values(), key=lambda p: (p.size, p.memory_mib, p.name))


def dynamic_profiles(model: str) -> list[mig.MigProfile]:
    """The profiles a dynamic MIG pool carves on a GPU of `model`."""
    return [profile for profile in mig.profiles_for(model).values() if not profile.single_per_gpu]


def mig_layout_problem(layout: str | Sequence[str], models: Sequence[str]) -> str | None:
    """Why a MIG layout cannot carve the pool's GPU models (each must take it), or None. A pool without
    GPUs yet: the layout must fit some MIG-capable model."""
    if not models:
        problems = []
        for model in mig.MIG_GEOMETRY:
            try:
                layout_of(model, layout)
                return None
            except mig.LayoutError as error:
                problems.append(str(error))
        return f"the layout fits no MIG-capable GPU model: {problems[0]}"
    for model in models:
        try:
            layout_of(model, layout)
        except mig.LayoutError as error:
            return f"the layout does not fit the pool's {model} GPUs: {error}"
    return None


def mig_part(profile: mig.MigProfile, start: int) -> tuple[int, int]:
    """The part of the share space a MIG instance holds: its memory slices, 125 milli each."""
    return start * MIG_SLICE_MILLI, (start + profile.size) * MIG_SLICE_MILLI


def _free_mig_instances(snapshot: PoolSnapshot, shape: Shape
                        ) -> tuple[dict[int, list[tuple[PoolGpu, mig.MigProfile, int]]], dict[int, int]]:
    """The free instances of the shape's profile for the window, per node, and how many instances of
    any profile each GPU has free."""
    busy = _busy_parts(snapshot)
    layouts: dict[str, list[tuple[mig.MigProfile, int]]] = {}
    free: dict[int, list[tuple[PoolGpu, mig.MigProfile, int]]] = defaultdict(list)  # node -> instances
    free_on_gpu: dict[int, int] = defaultdict(int)
    for gpu in snapshot.gpus:
        if not gpu.usable:
            continue
        if gpu.model not in layouts:
            layouts[gpu.model] = layout_offered(gpu.model, shape.mig_layout)
        for profile, start in layouts[gpu.model]:
            if _is_free(mig_part(profile, start), busy[gpu.id]):
                free_on_gpu[gpu.id] += 1
                if profile.name == shape.mig_profile:
                    free[gpu.node_id].append((gpu, profile, start))
    return free, free_on_gpu


def _choose_mig(snapshot: PoolSnapshot, shape: Shape) -> list[NewGrant]:
    """`mig_count` free instances of the profile in the GPUs' layouts. Static layouts leave nothing to
    place, only to choose: the instances go on as few nodes as possible (one when one node has
    enough), and within a node on the GPUs with the fewest free instances first, so wholly free GPUs
    stay free for the requests that need a whole layout's worth."""
    free, free_on_gpu = _free_mig_instances(snapshot, shape)
    total = sum(len(instances) for instances in free.values())
    if total < shape.mig_count:
        raise BookingRefused("insufficient_capacity", Msg(gettext_noop(
            "%(count)d × %(profile)s requested but only %(total)d are free for that window."),
            count=shape.mig_count, profile=shape.mig_profile, total=total))
    nodes = sorted(free.values(), key=lambda instances: (len(instances) < shape.mig_count, len(instances),
                                                          instances[0][0].node_name))
    if len(nodes[0]) < shape.mig_count:  # no node has them all: the fullest nodes first
        nodes.sort(key=lambda instances: (-len(instances), instances[0][0].node_name))
    chosen: list[tuple[PoolGpu, mig.MigProfile, int]] = []
    for instances in nodes:
        instances.sort(key=lambda item: (free_on_gpu[item[0].id], item[0].index, -item[2]))
        chosen.extend(instances[: shape.mig_count - len(chosen)])
        if len(chosen) == shape.mig_count:
            break
    return [NewGrant(gpu_id=gpu.id, ge=profile.compute_slices / units.MIG_COMPUTE_SLICES * gpu.weight, mode=SharingMode.MIG,
                     share_from=mig_part(profile, start)[0], share_to=mig_part(profile, start)[1],
                     milli=profile.milli, mig_profile=profile.name, mig_start=start, memory_mib=profile.memory_mib)
            for gpu, profile, start in chosen]


def slices_used(snapshot: PoolSnapshot) -> dict[int, int]:
    """Per GPU, the memory slices (a mask) some grant holds at some instant of the window: a dynamic MIG
    GPU's layout for the window is made of these instances, and only the other slices may be re-laid out.
    A grant that is not a MIG instance (a whole card, a share) holds all of them."""
    used: dict[int, int] = defaultdict(int)
    for grant in snapshot.grants:
        if grant.mig_profile and not grant.is_vgpu:
            first, last = grant.share_from // MIG_SLICE_MILLI, -(-grant.share_to // MIG_SLICE_MILLI)
            used[grant.gpu_id] |= ((1 << (last - first)) - 1) << first
        else:
            used[grant.gpu_id] |= mig.FULL_MASK
    return used


def _reported_free(snapshot: PoolSnapshot, profile: str, used: dict[int, int]
                   ) -> list[tuple[PoolGpu, mig.MigProfile, int]]:
    """Instances of `profile` a host reports its GPU already carved into (Gpu.mig_devices) whose slices no
    grant holds in the window: taking one changes no layout."""
    found = []
    for gpu in snapshot.gpus:
        geometry = mig.profile_for(gpu.model, profile) if gpu.usable else None
        if geometry is None:
            continue
        for device in gpu.mig_devices:
            start = device.get("start")
            if (device.get("profile") == profile and start in geometry.starts
                    and not used[gpu.id] & geometry.mask(start)):
                found.append((gpu, geometry, start))
    return found


def _choose_mig_dynamic(snapshot: PoolSnapshot, shape: Shape, policy: str) -> list[NewGrant]:
    """`mig_count` instances of the profile in a dynamic MIG pool, one at a time. A GPU's layout for the
    window is the instances its overlapping grants hold (future bookings included); the rest of it may
    be re-laid out. First an instance a host reports already carved and free (no change at all); else
    the placement engine carves one with its start-slice geometry and the pool's policy: the most-used
    GPU where the profile still fits at a legal start (its instances stay as they are), a wholly free GPU
    only when none has room, and on that GPU the start that leaves it least fragmented."""
    by_id = {gpu.id: gpu for gpu in snapshot.gpus}
    state = snapshot.state(mig_capable=True)
    used = slices_used(snapshot)
    chosen: list[tuple[PoolGpu, mig.MigProfile, int]] = []
    for _ in range(shape.mig_count):
        reported = _reported_free(snapshot, shape.mig_profile, used)
        if reported:
            gpu, profile, start = max(reported, key=lambda item: (mig.occupied_slices(used[item[0].id]),
                                                                   -item[0].index, item[2]))
        else:
            decision = place(state, PlacementRequest(mig_profile=shape.mig_profile, start=snapshot.start,
                                                     end=snapshot.end, allowed_models=frozenset(shape.gpu_models)),
                             policy_name(policy), profile=snapshot.profile)
            if not decision.ok:
                break
            assignment = decision.gpus[0]
            gpu, start = by_id[assignment.gpu_id], assignment.mig_start
            profile = mig.profile_for(gpu.model, shape.mig_profile)
        used[gpu.id] |= profile.mask(start)
        state = state.with_holdings([Holding(node_id=gpu.node_id, gpu_id=gpu.id, start=snapshot.start,
                                             end=snapshot.end, mig_profile=profile.name, mig_start=start,
                                             reservation_id="new")])
        chosen.append((gpu, profile, start))
    if len(chosen) < shape.mig_count:
        raise BookingRefused("insufficient_capacity", Msg(gettext_noop(
            "%(count)d × %(profile)s requested but only %(total)d can be carved from the free slices for that "
            "window."), count=shape.mig_count, profile=shape.mig_profile, total=len(chosen) + _carvable(
                snapshot, shape.mig_profile, used)))
    return [NewGrant(gpu_id=gpu.id, ge=profile.compute_slices / units.MIG_COMPUTE_SLICES * gpu.weight,
                     mode=SharingMode.MIG, share_from=mig_part(profile, start)[0], share_to=mig_part(profile, start)[1],
                     milli=profile.milli, mig_profile=profile.name, mig_start=start, memory_mib=profile.memory_mib)
            for gpu, profile, start in chosen]


def carvable_on(profile: mig.MigProfile, used_mask: int) -> int:
    """How many more instances of `profile` fit in a GPU's free slices (each at the first legal start
    left: the starts are aligned to the profile's size, so the first-fit count is the most)."""
    count = 0
    for start in profile.starts:
        if not used_mask & profile.mask(start):
            used_mask |= profile.mask(start)
            count += 1
    return count


def _carvable(snapshot: PoolSnapshot, profile_name: str, used: dict[int, int] | None = None) -> int:
    used = slices_used(snapshot) if used is None else used
    total = 0
    for gpu in snapshot.gpus:
        profile = mig.profile_for(gpu.model, profile_name) if gpu.usable else None
        if profile is not None:
            total += carvable_on(profile, used[gpu.id])
    return total


def _carvable_per_node(snapshot: PoolSnapshot, profile_name: str) -> dict[int, int]:
    used = slices_used(snapshot)
    per_node: dict[int, int] = defaultdict(int)
    for gpu in snapshot.gpus:
        profile = mig.profile_for(gpu.model, profile_name) if gpu.usable else None
        if profile is not None:
            per_node[gpu.node_id] += carvable_on(profile, used[gpu.id])
    return per_node


def vgpu_memory(shape: Shape, gpu_memory_mib: int) -> int:
    """The memory a vgpu request takes on a card of `gpu_memory_mib`, in MiB."""
    return shape.memory_mib or gpu_memory_mib * shape.memory_pct // 100


def vgpu_fraction(memory_mib: int, cores_pct: int, gpu_memory_mib: int) -> float:
    """What a vgpu grant is worth, as a fraction of the card: the larger of its memory and core shares."""
    return max(memory_mib / gpu_memory_mib if gpu_memory_mib else 1.0, cores_pct / 100)


def _vgpu_free(snapshot: PoolSnapshot) -> dict[int, tuple[int, int]]:
    """Per usable GPU, (memory MiB, cores %) free for all of the window; nothing on a GPU another mode
    holds at some instant of it."""
    held: dict[int, list[Grant]] = defaultdict(list)
    for grant in snapshot.grants:
        held[grant.gpu_id].append(grant)
    free = {}
    for gpu in snapshot.gpus:
        grants = held[gpu.id]
        if not gpu.usable or any(not g.is_vgpu for g in grants):
            continue
        memory = units.peak(((g.starts_at, g.ends_at, g.memory_mib or 0) for g in grants), snapshot.start,
                            snapshot.end).amount
        cores = units.peak(((g.starts_at, g.ends_at, g.cores_pct or 0) for g in grants), snapshot.start,
                           snapshot.end).amount
        free[gpu.id] = (gpu.memory_mib - memory, 100 - cores)
    return free


def _vgpu_fits(snapshot: PoolSnapshot, shape: Shape, free: dict[int, tuple[int, int]] | None = None
               ) -> dict[int, list[int]]:
    """Per node, the GPUs with the shape's memory and cores free for the whole window."""
    by_id = {gpu.id: gpu for gpu in snapshot.gpus}
    per_node: dict[int, list[int]] = defaultdict(list)
    for gpu_id, (memory, cores) in (free if free is not None else _vgpu_free(snapshot)).items():
        if memory >= vgpu_memory(shape, by_id[gpu_id].memory_mib) and cores >= shape.cores_pct:
            per_node[by_id[gpu_id].node_id].append(gpu_id)
    return per_node


def _choose_vgpu(snapshot: PoolSnapshot, shape: Shape, policy: str) -> list[NewGrant]:
    """Memory and cores on each of `gpus` GPUs of one node. The engine chooses with the pool's policy,
    seeing cores as milli-GPU and memory as the GPU's memory; a GPU fits when both are free for the
    whole window."""
    by_id = {gpu.id: gpu for gpu in snapshot.gpus}
    free = _vgpu_free(snapshot)
    per_node = _vgpu_fits(snapshot, shape, free)
    fits = {gpu_id for ids in per_node.values() for gpu_id in ids}
    if max((len(ids) for ids in per_node.values()), default=0) < shape.gpus:
        most_memory = max((memory for memory, _ in free.values()), default=0)
        most_cores = max((cores for _, cores in free.values()), default=0)
        share = Msg(gettext_noop("%(memory)s and %(cores)d %% of the cores"), memory=shape.memory_words(),
                    cores=shape.cores_pct)
        numbers = dict(share=share, fits=len(fits), most_memory=most_memory, most_cores=most_cores)
        if shape.gpus == 1:
            msg = Msg(gettext_noop("no GPU has %(share)s free for that window (%(fits)d GPU(s) could take one; the "
                                   "most memory free on one GPU is %(most_memory)d MiB, the most cores "
                                   "%(most_cores)d %%)."), **numbers)
        else:
            msg = Msg(gettext_noop("no node has %(gpus)d GPUs that each have %(share)s free for that window "
                                   "(%(fits)d GPU(s) could take one; the most memory free on one GPU is "
                                   "%(most_memory)d MiB, the most cores %(most_cores)d %%)."), gpus=shape.gpus,
                      **numbers)
        raise BookingRefused("fragmented" if len(fits) >= shape.gpus else "insufficient_capacity", msg)
    state = snapshot.state()
    chosen: list[int] = []
    candidates = sorted(per_node.items(), key=lambda item: (len(item[1]) < shape.gpus, by_id[item[1][0]].node_name))
    for node_id, _ in candidates:
        node_state = ClusterState(nodes=[n for n in state.nodes if n.id == node_id],
                                  holdings=[h for h in state.holdings if h.node_id == node_id])
        chosen = []
        for _ in range(shape.gpus):
            decision = place(node_state, _vgpu_request(shape, snapshot, min(by_id[g].memory_mib
                                                                           for g in per_node[node_id])),
                             policy_name(policy), profile=snapshot.profile)
            if not decision.ok or decision.gpus[0].gpu_id not in fits or decision.gpus[0].gpu_id in chosen:
                break
            chosen.append(decision.gpus[0].gpu_id)
            node_state = node_state.with_holdings(decision.holdings(reservation_id="new"))
        if len(chosen) == shape.gpus:
            break
        if len(per_node[node_id]) >= shape.gpus:  # the engine's arithmetic differs from ours: take ours
            chosen = sorted(per_node[node_id], key=lambda g: (-free[g][1], by_id[g].index))[: shape.gpus]
            break
    grants = []
    for gpu_id in chosen:
        gpu = by_id[gpu_id]
        memory = vgpu_memory(shape, gpu.memory_mib)
        fraction = vgpu_fraction(memory, shape.cores_pct, gpu.memory_mib)
        grants.append(NewGrant(gpu_id=gpu_id, ge=fraction * gpu.weight, mode=SharingMode.VGPU,
                               milli=max(1, min(units.MILLI_PER_GPU, math.ceil(fraction * units.MILLI_PER_GPU))),
                               memory_mib=memory, cores_pct=shape.cores_pct))
    return grants


def _vgpu_request(shape: Shape, snapshot: PoolSnapshot, gpu_memory_mib: int) -> PlacementRequest:
    allowed = frozenset(shape.gpu_models)
    if shape.cores_pct >= 100:
        return PlacementRequest(gpus=1, start=snapshot.start, end=snapshot.end, allowed_models=allowed)
    return PlacementRequest(milli=10 * shape.cores_pct, gpu_memory_mib=vgpu_memory(shape, gpu_memory_mib),
                            start=snapshot.start, end=snapshot.end, allowed_models=allowed)


@dataclass(frozen=True)
class Room:
    """How much of a shape a pool has free for the snapshot's window, in the shape's unit."""

    free: int  # shares, MIG instances of the profile, GPUs that could take the vGPU share, whole GPUs
    most_together: int  # the most of those one request could get: on one GPU (shares), one node (the rest)
    unit: str


def room(snapshot: PoolSnapshot, shape: Shape) -> Room:
    """What `choose` could give of `shape` for the window: the same arithmetic, counted instead of
    chosen (the availability timeline asks this once per slot), on the GPUs of the models it accepts."""
    snapshot = snapshot.of_models(shape.gpu_models)
    if shape.mode in REPLICA_MODES:
        counts = [len(slots) for slots in _free_share_slots(snapshot, shape.replicas).values()]
        return Room(sum(counts), max(counts, default=0), "shares")
    if shape.mode == SharingMode.MIG and shape.mig_dynamic:
        counts = list(_carvable_per_node(snapshot, shape.mig_profile).values())
        return Room(sum(counts), max(counts, default=0), "instances")
    if shape.mode == SharingMode.MIG:
        counts = [len(instances) for instances in _free_mig_instances(snapshot, shape)[0].values()]
        return Room(sum(counts), max(counts, default=0), "instances")
    if shape.mode == SharingMode.VGPU:
        counts = [len(ids) for ids in _vgpu_fits(snapshot, shape).values()]
        return Room(sum(counts), max(counts, default=0), "GPUs")
    per_node: dict[int, int] = defaultdict(int)
    for gpu in snapshot.whole_gpus_free():
        per_node[gpu.node_id] += 1
    return Room(sum(per_node.values()), max(per_node.values(), default=0), "GPUs")


def first_clash(snapshot: PoolSnapshot, held: Sequence[NewGrant]) -> Grant | None:
    """The earliest grant of another reservation that keeps one of `held` (a reservation's own grants)
    from holding the same part of its GPU for the snapshot's window (an extension's extra time), or
    None when they all stay free."""
    clashes: list[Grant] = []
    others: dict[int, list[Grant]] = defaultdict(list)
    for grant in snapshot.grants:
        others[grant.gpu_id].append(grant)
    memory_of = {gpu.id: gpu.memory_mib for gpu in snapshot.gpus}
    for own in held:
        on_gpu = others[own.gpu_id]
        if own.mode != SharingMode.VGPU:
            clashes.extend(g for g in on_gpu
                           if g.is_vgpu or not (own.share_to <= g.share_from or g.share_to <= own.share_from))
            continue
        clashes.extend(g for g in on_gpu if not g.is_vgpu)
        # Sums of memory and cores: the first start at which they would exceed the card, with this grant.
        vgpus = sorted((g for g in on_gpu if g.is_vgpu), key=lambda g: g.starts_at)
        for candidate in vgpus:
            at = max(candidate.starts_at, snapshot.start)
            holding = [g for g in vgpus if g.starts_at <= at < g.ends_at]
            if (sum(g.memory_mib or 0 for g in holding) + (own.memory_mib or 0) > memory_of.get(own.gpu_id, 0)
                    or sum(g.cores_pct or 0 for g in holding) + (own.cores_pct or 0) > 100):
                clashes.append(candidate)
                break
    return min(clashes, key=lambda g: g.starts_at, default=None)


def grants_write(*, reservation_id: int, grants: Sequence[NewGrant], start: datetime, end: datetime) -> None:
    """Write `grants` for the reservation over [start, end)."""
    start, end = sql.db_datetime(start), sql.db_datetime(end)
    sql.execute(
        "INSERT INTO allocations_allocation (reservation_id, gpu_id, starts_at, ends_at, mode, ge, share_from, "
        "share_to, milli, mig_profile, mig_start, memory_mib, cores_pct) VALUES " + sql.values_rows(len(grants), 13),
        [value for g in grants for value in (reservation_id, g.gpu_id, start, end, g.mode, g.ge, g.share_from,
                                             g.share_to, g.milli, g.mig_profile, g.mig_start, g.memory_mib,
                                             g.cores_pct)],
    )


def mig_instance_id(gpu_uuid: str, mig_devices: Sequence[dict] | None, profile: str, start: int | None) -> str:
    """A MIG instance's stable name: the MIG device UUID the GPU reported for that profile and start
    slice (Gpu.mig_devices, from NVML on a host), else "<GPU UUID>/<start slice>"."""
    for device in mig_devices or ():
        if device.get("profile") == profile and device.get("start") == start and device.get("uuid"):
            return str(device["uuid"])
    return f"{gpu_uuid}/{start}"
