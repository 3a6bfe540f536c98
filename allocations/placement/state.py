"""The portal's view of the pool: nodes, GPUs and holdings over time, as plain dataclasses.

The reservation service builds a :class:`ClusterState` from its database (nodes, GPUs,
and every live allocation as a :class:`Holding` with its window) and asks for a
placement; nothing here touches Django.

Time windows are half-open, ``[start, end)``, in seconds (datetimes are converted). For
a request window, :meth:`ClusterState.arrays_for_window` computes what is free *for the
whole window*: per node and per GPU, capacity minus the **peak** concurrent use inside
the window (two holdings that follow each other inside the window do not add up), and
for MIG the union of the slices any overlapping holding occupies. Future reservations
are therefore first-class: a holding next week blocks a request that overlaps next
week, and nothing else.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from allocations import units

from .arrays import AFFINITY_BIG, AFFINITY_MIG, AFFINITY_SHARE, ClusterArrays
from .mig import FULL_MASK, profile_for
from .requests import MILLI_PER_GPU, Time, to_seconds


class InvalidState(ValueError):
    """The state handed in contradicts itself (unknown ids, impossible holdings)."""


@dataclass(frozen=True)
class GpuInfo:
    id: Hashable
    index: int
    model: str
    memory_mib: int = 0
    mig_capable: bool = False
    healthy: bool = True


@dataclass(frozen=True)
class NodeInfo:
    id: Hashable
    cpu_milli: int
    memory_mib: int
    gpus: tuple[GpuInfo, ...] = ()
    labels: Mapping[str, str] = field(default_factory=dict)
    healthy: bool = True
    schedulable: bool = True


@dataclass(frozen=True)
class Holding:
    """Something held on a node over ``[start, end)``.

    ``gpu_id`` None means CPU/memory only. ``milli`` is the share of that GPU (1000 =
    whole). MIG holdings name the profile and start slice. ``cpu_milli``/``memory_mib``
    are node-level amounts (a multi-GPU reservation may put them on one of its holdings).
    """

    node_id: Hashable
    start: Time
    end: Time
    gpu_id: Hashable | None = None
    milli: int = 0
    gpu_memory_mib: int = 0
    mig_profile: str | None = None
    mig_start: int | None = None
    cpu_milli: int = 0
    memory_mib: int = 0
    reservation_id: Hashable | None = None
    team: str | None = None

    @property
    def window(self) -> tuple[float, float]:
        return to_seconds(self.start), to_seconds(self.end)


def overlaps(window: tuple[float, float], start: float, end: float) -> bool:
    s, e = window
    return s < end and start < e


@dataclass
class ClusterState:
    nodes: Sequence[NodeInfo]
    holdings: Sequence[Holding] = ()
    _base: ClusterArrays | None = field(default=None, init=False, repr=False)
    _slot_of: dict[Hashable, tuple[int, int]] = field(default_factory=dict, init=False, repr=False)
    _node_of: dict[Hashable, int] = field(default_factory=dict, init=False, repr=False)

    def __post_init__(self) -> None:
        self.nodes = list(self.nodes)
        self.holdings = list(self.holdings)
        for i, node in enumerate(self.nodes):
            if node.id in self._node_of:
                raise InvalidState(f"node id {node.id!r} appears twice")
            self._node_of[node.id] = i
            for slot, gpu in enumerate(sorted(node.gpus, key=lambda g: g.index)):
                if gpu.id in self._slot_of:
                    raise InvalidState(f"GPU id {gpu.id!r} appears twice")
                self._slot_of[gpu.id] = (i, slot)

    # ----------------------------------------------------------------- lookups
    def node_index(self, node_id: Hashable) -> int:
        try:
            return self._node_of[node_id]
        except KeyError:
            raise InvalidState(f"unknown node {node_id!r}") from None

    def gpu_slot(self, gpu_id: Hashable) -> tuple[int, int]:
        try:
            return self._slot_of[gpu_id]
        except KeyError:
            raise InvalidState(f"unknown GPU {gpu_id!r}") from None

    def sorted_gpus(self, node: NodeInfo) -> list[GpuInfo]:
        return sorted(node.gpus, key=lambda g: g.index)

    def label_mask(self, required: Mapping[str, str]) -> np.ndarray | None:
        """Nodes carrying every required label (None when nothing is required)."""
        if not required:
            return None
        return np.array([all(n.labels.get(k) == v for k, v in required.items()) for n in self.nodes], dtype=bool)

    def with_holdings(self, extra: Iterable[Holding]) -> ClusterState:
        """A new state with more holdings (the same nodes, so the empty-cluster arrays are shared)."""
        state = ClusterState(self.nodes, [*self.holdings, *extra])
        state._base = self._base  # never mutated: arrays_for_window works on a copy
        return state

    # ----------------------------------------------------------------- arrays
    def base_arrays(self) -> ClusterArrays:
        """The empty cluster (cached: nodes do not change within a state)."""
        if self._base is None:
            gpus = [self.sorted_gpus(n) for n in self.nodes]
            self._base = ClusterArrays.build(
                node_ids=[n.id for n in self.nodes],
                cpu_milli=[n.cpu_milli for n in self.nodes],
                memory_mib=[n.memory_mib for n in self.nodes],
                gpu_models=[[g.model for g in gs] for gs in gpus],
                gpu_ids=[[g.id for g in gs] for gs in gpus],
                gpu_memory_mib=[[g.memory_mib for g in gs] for gs in gpus],
                gpu_healthy=[[g.healthy for g in gs] for gs in gpus],
                mig_capable=[[g.mig_capable for g in gs] for gs in gpus],
                node_ok=[n.healthy and n.schedulable for n in self.nodes],
            )
        return self._base

    def arrays_for_window(self, start: Time, end: Time) -> ClusterArrays:
        """Free capacity for the whole window ``[start, end)`` (a fresh, mutable copy)."""
        ws, we = to_seconds(start), to_seconds(end)
        if not we > ws:
            raise ValueError("window must end after it starts")
        arrays = self.base_arrays().copy()
        node_cpu: dict[int, list[tuple[float, float, float]]] = defaultdict(list)
        node_mem: dict[int, list[tuple[float, float, float]]] = defaultdict(list)
        gpu_milli: dict[tuple[int, int], list[tuple[float, float, float]]] = defaultdict(list)
        gpu_mem: dict[tuple[int, int], list[tuple[float, float, float]]] = defaultdict(list)
        whole: dict[tuple[int, Hashable], int] = defaultdict(int)
        for h in self.holdings:
            hs, he = h.window
            if not overlaps((ws, we), hs, he):
                continue
            n = self.node_index(h.node_id)
            if h.cpu_milli:
                node_cpu[n].append((hs, he, h.cpu_milli))
            if h.memory_mib:
                node_mem[n].append((hs, he, h.memory_mib))
            if h.gpu_id is None:
                continue
            gn, slot = self.gpu_slot(h.gpu_id)
            if gn != n:
                raise InvalidState(f"holding on GPU {h.gpu_id!r} names node {h.node_id!r}, but the GPU is elsewhere")
            if h.mig_profile is not None:
                model = arrays.models[int(arrays.gpu_model[n, slot])]
                profile = profile_for(model, h.mig_profile)
                if profile is None or h.mig_start not in profile.starts:
                    raise InvalidState(f"MIG holding {h.mig_profile}@{h.mig_start} is not legal on a {model}")
                arrays.mig_used[n, slot] |= profile.mask(h.mig_start)
                arrays.mig_media[n, slot] |= profile.single_per_gpu
                arrays.gpu_free[n, slot] = 0
                arrays.affinity[n, AFFINITY_MIG] += 1
            else:
                if not 1 <= h.milli <= MILLI_PER_GPU:
                    raise InvalidState(f"holding on GPU {h.gpu_id!r} has milli {h.milli} (must be 1-1000)")
                gpu_milli[(n, slot)].append((hs, he, h.milli))
                if h.gpu_memory_mib:
                    gpu_mem[(n, slot)].append((hs, he, h.gpu_memory_mib))
                if h.milli < MILLI_PER_GPU:
                    arrays.affinity[n, AFFINITY_SHARE] += 1
                else:
                    # Whole GPUs of one reservation on one node form one "k-GPU task" (clustering tags).
                    whole[(n, h.reservation_id if h.reservation_id is not None else id(h))] += 1
        for (n, _), k in whole.items():
            arrays.affinity[n, min(k, AFFINITY_BIG)] += 1
        for n, iv in node_cpu.items():
            arrays.cpu_free[n] -= int(math.ceil(units.peak(iv, ws, we).amount))
        for n, iv in node_mem.items():
            arrays.mem_free[n] -= int(math.ceil(units.peak(iv, ws, we).amount))
        for (n, slot), iv in gpu_milli.items():
            used = int(units.peak(iv, ws, we).amount)
            # MIG-carved for part of the window and milli-shared for another part: the
            # GPU can serve neither kind for the whole window (gpu_free is already 0).
            arrays.gpu_free[n, slot] = max(0, arrays.gpu_free[n, slot] - used)
            if arrays.mig_capable[n, slot]:
                arrays.mig_used[n, slot] = FULL_MASK
        for (n, slot), iv in gpu_mem.items():
            arrays.gpu_mem_free[n, slot] = max(0, arrays.gpu_mem_free[n, slot] - int(units.peak(iv, ws, we).amount))
        np.maximum(arrays.cpu_free, 0, out=arrays.cpu_free)
        np.maximum(arrays.mem_free, 0, out=arrays.mem_free)
        arrays.version += 1
        return arrays

    def boundaries_after(self, t: float) -> list[float]:
        """Times after ``t`` where some holding ends (candidate start times for a request)."""
        return sorted({h.window[1] for h in self.holdings if h.window[1] > t and math.isfinite(h.window[1])})
