"""The seam between the reservation service and the placement engine.

The service reads the pool for a window in one query (every GPU, whether it can be used,
whether an allocation overlapping the window holds it) and asks `choose_whole_gpus`
which GPUs to take. Requests that fit on one node go to the placement engine
(`allocations/placement/`) with the pool's policy; larger ones take whole nodes here,
because the engine places a request on one node only. Plain data in, plain data out:
no Django here.
"""
from __future__ import annotations

import logging
from collections import defaultdict
from dataclasses import dataclass
from datetime import datetime
from typing import Sequence

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

log = logging.getLogger(__name__)

# A node whose CPU or memory capacity is unknown (0 in inventory) must not look starved to
# the policies that weigh CPU and memory, so it gets this much instead.
_UNKNOWN_CAPACITY = 10**9


@dataclass(frozen=True)
class PoolGpu:
    """One GPU of the pool as placement sees it for one window."""

    id: int
    node_id: int
    node_name: str
    index: int
    uuid: str = ""
    model: str = ""
    memory_mib: int = 0
    usable: bool = True  # a healthy GPU on a healthy, schedulable node
    busy: bool = False  # an allocation overlapping the window holds it
    node_cpu_milli: int = 0
    node_memory_mib: int = 0

    @property
    def free(self) -> bool:
        return self.usable and not self.busy


class Unplaceable(Exception):
    """No set of GPUs satisfies the request; `code` is machine-readable, the message is for people."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def policy_name(name: str | None) -> str:
    """The engine policy for a pool's `placement_policy` (empty or unknown names get the default).

    The API only accepts known names; this guards rows written some other way (admin, SQL)."""
    if name in POLICY_NAMES:
        return name
    if name:
        log.warning("unknown placement policy %r; using %s", name, DEFAULT_POLICY)
    return DEFAULT_POLICY


def choose_whole_gpus(gpus: Sequence[PoolGpu], count: int, *, start: datetime, end: datetime,
                      policy: str = DEFAULT_POLICY) -> list[int]:
    """Pick `count` free GPUs for [start, end) from the pool's GPUs (in a stable node order).

    A request that fits on one node of the pool (count <= the most GPUs any node has) is
    placed on one node, because multi-GPU jobs want NVLink/PCIe locality; the engine
    picks the node and GPUs with the pool's policy, so the remnants stay usable. A larger
    request takes whole nodes, the emptiest first, to touch as few nodes as possible.
    """
    free = [g for g in gpus if g.free]
    if len(free) < count:
        raise Unplaceable(
            "insufficient_capacity",
            f"{count} GPUs requested but only {len(free)} are free for the whole window.",
        )
    per_node: dict[int, list[PoolGpu]] = defaultdict(list)
    for gpu in gpus:
        per_node[gpu.node_id].append(gpu)
    # "Fits on one node" counts the GPUs a node can give: a dead one does not make a node big enough.
    if count <= max(sum(g.usable for g in node_gpus) for node_gpus in per_node.values()):
        return _one_node(per_node, count, start=start, end=end, policy=policy)
    return _whole_nodes(free, count)


def _one_node(per_node: dict[int, list[PoolGpu]], count: int, *, start: datetime, end: datetime,
              policy: str) -> list[int]:
    nodes, holdings = [], []
    for node_id, node_gpus in per_node.items():
        first = node_gpus[0]
        nodes.append(NodeInfo(
            id=node_id,
            cpu_milli=first.node_cpu_milli or _UNKNOWN_CAPACITY,
            memory_mib=first.node_memory_mib or _UNKNOWN_CAPACITY,
            gpus=tuple(GpuInfo(id=g.id, index=g.index, model=g.model or "unknown", memory_mib=g.memory_mib,
                               healthy=g.usable) for g in node_gpus),
        ))
        # A GPU busy at any moment of the window is busy for all of it (that is what the
        # service's query says), so one holding over the whole window stands for it.
        holdings.extend(Holding(node_id=node_id, gpu_id=g.id, milli=1000, start=start, end=end)
                        for g in node_gpus if g.busy)
    decision = place(ClusterState(nodes=nodes, holdings=holdings),
                     PlacementRequest(gpus=count, start=start, end=end), policy_name(policy))
    if not decision.ok:
        raise Unplaceable(decision.code, decision.message)
    return [assignment.gpu_id for assignment in decision.gpus]


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
