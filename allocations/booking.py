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
from collections import defaultdict
from dataclasses import dataclass
from datetime import datetime
from typing import Sequence

from allocations import units
from allocations.placement import (
    DEFAULT_POLICY,
    POLICY_NAMES,
    ClusterState,
    GpuInfo,
    Holding,
    NodeInfo,
    PlacementRequest,
    place,
)
from allocations.models import AllocationQuerySet
from common import sql

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


class BookingRefused(Exception):
    """No set of GPUs satisfies the request; `code` is machine-readable, the message is for people."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


@dataclass(frozen=True)
class PoolSnapshot:
    """A pool for the window [start, end): its GPUs (in a stable node order) and the grants overlapping it."""

    start: datetime
    end: datetime
    gpus: tuple[PoolGpu, ...]
    grants: tuple[Grant, ...]

    def state(self) -> ClusterState:
        """The snapshot as the placement engine takes it."""
        nodes: dict[int, list[PoolGpu]] = defaultdict(list)
        for gpu in self.gpus:
            nodes[gpu.node_id].append(gpu)
        node_of = {gpu.id: gpu.node_id for gpu in self.gpus}
        return ClusterState(
            nodes=[NodeInfo(
                id=node_id,
                cpu_milli=node_gpus[0].node_cpu_milli or _UNKNOWN_CAPACITY,
                memory_mib=node_gpus[0].node_memory_mib or _UNKNOWN_CAPACITY,
                gpus=tuple(GpuInfo(id=g.id, index=g.index, model=g.model or "unknown", memory_mib=g.memory_mib,
                                   healthy=g.usable) for g in node_gpus),
            ) for node_id, node_gpus in nodes.items()],
            holdings=[Holding(node_id=node_of[grant.gpu_id], gpu_id=grant.gpu_id, start=grant.starts_at,
                              end=grant.ends_at, milli=0 if grant.mig_profile else grant.milli,
                              mig_profile=grant.mig_profile or None, mig_start=grant.mig_start,
                              reservation_id=grant.reservation_id)
                      for grant in self.grants if grant.gpu_id in node_of],
        )

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


def pool_snapshot(pool_id: int, start: datetime, end: datetime, *,
                  without_reservation: int | None = None) -> PoolSnapshot:
    """Read the pool for [start, end) (the caller holds the pool's row lock). `without_reservation`
    leaves that reservation's own grants out (an extension asks whether its GPUs stay free).
    Two hand-written queries: every create runs them."""
    gpu_rows = sql.fetch_all(
        'SELECT g.id, g.node_id, n.name, g."index", g.uuid, g.model_name, g.memory_mib, '
        "g.healthy AND n.healthy AND n.schedulable, "  # GpuQuerySet.USABLE, by hand
        "n.cpu_milli, n.memory_mib "
        "FROM inventory_gpu g JOIN inventory_node n ON n.id = g.node_id "
        'WHERE g.pool_id = %s ORDER BY n.name, g.node_id, g."index"',
        [pool_id],
    )
    grant_query = (
        "SELECT a.gpu_id, a.reservation_id, a.starts_at, a.ends_at, a.milli, a.mig_profile, a.mig_start "
        "FROM allocations_allocation a JOIN inventory_gpu g ON g.id = a.gpu_id "
        f"WHERE g.pool_id = %s AND {AllocationQuerySet.BOOKED_DURING_SQL}")
    params = [pool_id, sql.db_datetime(end), sql.db_datetime(start)]
    if without_reservation is not None:
        grant_query += " AND a.reservation_id <> %s"
        params.append(without_reservation)
    return PoolSnapshot(
        start=start, end=end,
        gpus=tuple(PoolGpu(id=gpu_id, node_id=node_id, node_name=node_name, index=index, uuid=uuid, model=model,
                           memory_mib=memory, usable=bool(usable), node_cpu_milli=cpu, node_memory_mib=node_memory)
                   for (gpu_id, node_id, node_name, index, uuid, model, memory, usable, cpu, node_memory) in gpu_rows),
        grants=tuple(Grant(gpu_id=gpu_id, reservation_id=rid, starts_at=sql.aware(a_start), ends_at=sql.aware(a_end),
                           milli=milli, mig_profile=mig_profile, mig_start=mig_start)
                     for (gpu_id, rid, a_start, a_end, milli, mig_profile, mig_start) in sql.fetch_all(grant_query,
                                                                                                       params)),
    )


def policy_name(name: str | None) -> str:
    """The engine policy for a pool's `placement_policy` (empty or unknown names get the default).

    The API only accepts known names; this guards rows written some other way (admin, SQL)."""
    if name in POLICY_NAMES:
        return name
    if name:
        log.warning("unknown placement policy %r; using %s", name, DEFAULT_POLICY)
    return DEFAULT_POLICY


def choose_whole_gpus(snapshot: PoolSnapshot, count: int, *, policy: str = DEFAULT_POLICY) -> list[int]:
    """Pick `count` GPUs whose whole card is free for the snapshot's window.

    A request that fits on one node of the pool (count <= the most usable GPUs any node has)
    is placed on one node, because multi-GPU jobs want NVLink/PCIe locality; the engine
    picks the node and GPUs with the pool's policy, so the remnants stay usable. A larger
    request takes whole nodes, the emptiest first, to touch as few nodes as possible.
    """
    state = snapshot.state()
    free = snapshot.whole_gpus_free(state)
    if len(free) < count:
        raise BookingRefused(
            "insufficient_capacity",
            f"{count} GPUs requested but only {len(free)} are free for the whole window.",
        )
    usable_per_node: dict[int, int] = defaultdict(int)
    for gpu in snapshot.gpus:
        usable_per_node[gpu.node_id] += gpu.usable
    if count <= max(usable_per_node.values()):
        decision = place(state, PlacementRequest(gpus=count, start=snapshot.start, end=snapshot.end),
                         policy_name(policy))
        if not decision.ok:
            raise BookingRefused(decision.code, decision.message)
        return [assignment.gpu_id for assignment in decision.gpus]
    return _whole_nodes(free, count)


def _whole_nodes(free: list[PoolGpu], count: int) -> list[int]:
    by_node: dict[int, list[PoolGpu]] = defaultdict(list)
    for gpu in free:
        by_node[gpu.node_id].append(gpu)
    chosen: list[int] = []
    for node_gpus in sorted(by_node.values(), key=lambda g: (-len(g), g[0].node_name, g[0].node_id)):
        chosen.extend(gpu.id for gpu in sorted(node_gpus, key=lambda g: g.index)[: count - len(chosen)])
        if len(chosen) == count:
            break
    return chosen


def first_clash(snapshot: PoolSnapshot, gpu_ids: Sequence[int]) -> Grant | None:
    """The earliest grant of another reservation that keeps one of `gpu_ids` from being wholly free for
    the snapshot's window (an extension's extra time), or None when they all stay free."""
    busy = set(gpu_ids) - {gpu.id for gpu in snapshot.whole_gpus_free()}
    if not busy:
        return None
    return min((grant for grant in snapshot.grants if grant.gpu_id in busy), key=lambda g: g.starts_at,
               default=None)


def grants_write(*, reservation_id: int, gpu_ids: Sequence[int], start: datetime, end: datetime) -> None:
    """One whole-GPU grant per GPU over [start, end) (the share columns keep their whole-card defaults)."""
    start, end = sql.db_datetime(start), sql.db_datetime(end)
    sql.execute(
        "INSERT INTO allocations_allocation (reservation_id, gpu_id, starts_at, ends_at) VALUES "
        + sql.values_rows(len(gpu_ids), 4),
        [value for gpu_id in gpu_ids for value in (reservation_id, gpu_id, start, end)],
    )


def mig_instance_id(gpu_uuid: str, mig_devices: Sequence[dict] | None, profile: str, start: int | None) -> str:
    """A MIG instance's stable name: the MIG device UUID the GPU reported for that profile and start
    slice (Gpu.mig_devices, from NVML on a host), else "<GPU UUID>/<start slice>"."""
    for device in mig_devices or ():
        if device.get("profile") == profile and device.get("start") == start and device.get("uuid"):
            return str(device["uuid"])
    return f"{gpu_uuid}/{start}"
