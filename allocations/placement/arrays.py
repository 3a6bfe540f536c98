"""The cluster as NumPy arrays: free capacity of every node and GPU for one window.

Every policy scores nodes from a :class:`ClusterArrays`; the portal API builds one from its
holdings for the requested window (:mod:`allocations.placement.state`), the trace benchmark
builds one from the CSV and updates it in place. Policies therefore share one
implementation between the two.

Layout: ``N`` nodes, ``G`` = the most GPUs any node has. Per-GPU arrays are ``(N, G)``;
slots beyond a node's GPU count are padding with ``gpu_usable = False`` and no free
capacity, so sums and comparisons over a row need no masking.

Invariants (checked by the property tests):

* ``0 <= gpu_free <= 1000``; ``gpu_free == 0`` on padding, unhealthy and MIG-mode GPUs
  (a GPU carrying MIG instances cannot also be shared by milli or taken whole);
* ``0 <= gpu_mem_free <= gpu_mem_total``; ``cpu_free <= cpu_cap``; ``mem_free <= mem_cap``;
* ``mig_used`` is an 8-bit mask of used memory slices, ``FULL_MASK`` when a non-MIG
  holding blocks MIG on that GPU;
* ``version[n]`` increases whenever row ``n`` changes (score caches key on it).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .mig import FULL_MASK, profile_for, profiles_for
from .requests import MILLI_PER_GPU, Demand, Kind

#: Columns of :attr:`ClusterArrays.affinity`: 0 = shared-GPU tasks, n = n-GPU tasks (n < 17),
#: 17 = larger whole-GPU tasks, 18 = MIG tasks. Used by the clustering policy.
AFFINITY_COLUMNS = 19
AFFINITY_SHARE = 0
AFFINITY_BIG = 17
AFFINITY_MIG = 18


def affinity_column(demand: Demand) -> int | None:
    """The clustering tag of a demand (None for CPU-only work, which carries no GPU tag)."""
    kind = demand.kind
    if kind is Kind.CPU_ONLY:
        return None
    if kind is Kind.MIG:
        return AFFINITY_MIG
    if kind is Kind.FRACTION:
        return AFFINITY_SHARE
    return demand.num_gpu if demand.num_gpu < AFFINITY_BIG else AFFINITY_BIG


@dataclass
class ClusterArrays:
    node_ids: list[Any]
    gpu_ids: list[list[Any]]  # per node, slot -> the caller's GPU id
    models: list[str]  # model vocabulary; model indexes below point into it
    model_idx: np.ndarray  # (N,) node's GPU model (its first GPU's), -1 for GPU-less nodes
    gpu_model: np.ndarray  # (N, G) model index per GPU slot, -1 on padding
    cpu_cap: np.ndarray
    mem_cap: np.ndarray
    cpu_free: np.ndarray
    mem_free: np.ndarray
    gpu_count: np.ndarray  # (N,) physical GPUs (healthy or not)
    gpu_free: np.ndarray  # (N, G) int32 milli free for non-MIG use
    gpu_mem_total: np.ndarray  # (N, G) MiB
    gpu_mem_free: np.ndarray  # (N, G) MiB
    gpu_usable: np.ndarray  # (N, G) bool: exists and healthy
    mig_capable: np.ndarray  # (N, G) bool
    mig_used: np.ndarray  # (N, G) int16 slice mask
    mig_media: np.ndarray  # (N, G) bool: a +me instance already lives there
    node_ok: np.ndarray  # (N,) bool: healthy and schedulable
    affinity: np.ndarray  # (N, AFFINITY_COLUMNS) counts of GPU tasks by tag
    tie_rank: np.ndarray  # (N,) lower wins ties between equal scores
    version: np.ndarray = field(init=False)

    def __post_init__(self) -> None:
        self.version = np.zeros(len(self.node_ids), dtype=np.int64)

    # ----------------------------------------------------------------- building
    @classmethod
    def build(
        cls,
        node_ids: Sequence[Any],
        cpu_milli: Sequence[int] | np.ndarray,
        memory_mib: Sequence[int] | np.ndarray,
        gpu_models: Sequence[Sequence[str]],
        *,
        gpu_ids: Sequence[Sequence[Any]] | None = None,
        gpu_memory_mib: Sequence[Sequence[int]] | None = None,
        gpu_healthy: Sequence[Sequence[bool]] | None = None,
        mig_capable: Sequence[Sequence[bool]] | None = None,
        node_ok: Sequence[bool] | None = None,
        tie_rank: Sequence[int] | None = None,
    ) -> ClusterArrays:
        """An empty (nothing held) cluster. ``gpu_models[n]`` lists node n's GPUs by index."""
        n = len(node_ids)
        g = max((len(m) for m in gpu_models), default=0)
        g = max(g, 1)
        models: list[str] = sorted({m for ms in gpu_models for m in ms})
        midx = {m: i for i, m in enumerate(models)}
        gpu_model = np.full((n, g), -1, dtype=np.int16)
        usable = np.zeros((n, g), dtype=bool)
        mem_total = np.zeros((n, g), dtype=np.int64)
        mig_cap = np.zeros((n, g), dtype=bool)
        for i, ms in enumerate(gpu_models):
            for j, m in enumerate(ms):
                gpu_model[i, j] = midx[m]
                usable[i, j] = True if gpu_healthy is None else bool(gpu_healthy[i][j])
                if gpu_memory_mib is not None:
                    mem_total[i, j] = int(gpu_memory_mib[i][j])
                # MIG needs both the hardware flag and a geometry we know for the model.
                if mig_capable is not None:
                    mig_cap[i, j] = bool(mig_capable[i][j]) and bool(profiles_for(m))
        cpu = np.asarray(cpu_milli, dtype=np.int64)
        mem = np.asarray(memory_mib, dtype=np.int64)
        ids = [list(x) for x in gpu_ids] if gpu_ids is not None else [list(range(len(ms))) for ms in gpu_models]
        return cls(
            node_ids=list(node_ids),
            gpu_ids=ids,
            models=models,
            model_idx=gpu_model[:, 0].astype(np.int16).copy(),
            gpu_model=gpu_model,
            cpu_cap=cpu.copy(),
            mem_cap=mem.copy(),
            cpu_free=cpu.copy(),
            mem_free=mem.copy(),
            gpu_count=np.asarray([len(ms) for ms in gpu_models], dtype=np.int16),
            gpu_free=np.where(usable, MILLI_PER_GPU, 0).astype(np.int32),
            gpu_mem_total=mem_total,
            gpu_mem_free=mem_total.copy(),
            gpu_usable=usable,
            mig_capable=mig_cap,
            mig_used=np.zeros((n, g), dtype=np.int16),
            mig_media=np.zeros((n, g), dtype=bool),
            node_ok=np.ones(n, dtype=bool) if node_ok is None else np.asarray(node_ok, dtype=bool),
            affinity=np.zeros((n, AFFINITY_COLUMNS), dtype=np.int32),
            tie_rank=np.arange(n, dtype=np.int64) if tie_rank is None else np.asarray(tie_rank, dtype=np.int64),
        )

    # ----------------------------------------------------------------- queries
    @property
    def n_nodes(self) -> int:
        return len(self.node_ids)

    @property
    def max_gpus(self) -> int:
        return int(self.gpu_free.shape[1])

    def model_mask(self, allowed: frozenset[str]) -> np.ndarray:
        """Bool per model index (plus a trailing False for index -1): is the model allowed?"""
        ok = np.ones(len(self.models) + 1, dtype=bool) if not allowed else np.zeros(len(self.models) + 1, dtype=bool)
        if allowed:
            for i, m in enumerate(self.models):
                ok[i] = m in allowed
        ok[-1] = False  # index -1 (padding / no GPU) is never an allowed GPU
        return ok

    def gpu_capacity_milli(self) -> int:
        return int(self.gpu_usable.sum()) * MILLI_PER_GPU

    # ----------------------------------------------------------------- updates
    def apply(self, node: int, demand: Demand, slots: Sequence[int], mig_start: int | None = None) -> None:
        """Take ``demand`` on ``node`` using GPU ``slots`` (and MIG start slice, for MIG)."""
        self.cpu_free[node] -= demand.cpu_milli
        self.mem_free[node] -= demand.memory_mib
        kind = demand.kind
        if kind is Kind.MIG:
            (slot,) = slots
            model = self.models[int(self.gpu_model[node, slot])]
            profile = profile_for(model, demand.mig_profile or "")
            assert profile is not None and mig_start is not None
            self.mig_used[node, slot] |= profile.mask(mig_start)
            self.mig_media[node, slot] |= profile.single_per_gpu
            self.gpu_free[node, slot] = 0  # now in MIG mode: no milli sharing, no whole use
        elif kind is not Kind.CPU_ONLY:
            for slot in slots:
                self.gpu_free[node, slot] -= demand.milli
                self.gpu_mem_free[node, slot] -= demand.gpu_memory_mib
                if self.mig_capable[node, slot]:
                    self.mig_used[node, slot] = FULL_MASK  # shared by milli: no MIG until released
        col = affinity_column(demand)
        if col is not None:
            self.affinity[node, col] += 1
        self.version[node] += 1

    def release(self, node: int, demand: Demand, slots: Sequence[int], mig_start: int | None = None) -> None:
        """Undo :meth:`apply` (used by the time-replay benchmark when a task ends)."""
        self.cpu_free[node] += demand.cpu_milli
        self.mem_free[node] += demand.memory_mib
        kind = demand.kind
        if kind is Kind.MIG:
            (slot,) = slots
            model = self.models[int(self.gpu_model[node, slot])]
            profile = profile_for(model, demand.mig_profile or "")
            assert profile is not None and mig_start is not None
            self.mig_used[node, slot] &= ~profile.mask(mig_start)
            if profile.single_per_gpu:
                self.mig_media[node, slot] = False
            if self.mig_used[node, slot] == 0:
                self.gpu_free[node, slot] = MILLI_PER_GPU
        elif kind is not Kind.CPU_ONLY:
            for slot in slots:
                self.gpu_free[node, slot] += demand.milli
                self.gpu_mem_free[node, slot] += demand.gpu_memory_mib
                if self.mig_capable[node, slot] and self.gpu_free[node, slot] == MILLI_PER_GPU:
                    self.mig_used[node, slot] = 0
        col = affinity_column(demand)
        if col is not None:
            self.affinity[node, col] -= 1
        self.version[node] += 1

    def intersect(self, other: ClusterArrays) -> ClusterArrays:
        """What is free in both ``self`` and ``other`` (same cluster, two moments of one window).

        A request whose window spans both moments may use only capacity free in both.
        """
        out = self.copy()
        np.minimum(out.cpu_free, other.cpu_free, out=out.cpu_free)
        np.minimum(out.mem_free, other.mem_free, out=out.mem_free)
        np.minimum(out.gpu_free, other.gpu_free, out=out.gpu_free)
        np.minimum(out.gpu_mem_free, other.gpu_mem_free, out=out.gpu_mem_free)
        out.mig_used |= other.mig_used
        out.mig_media |= other.mig_media
        np.maximum(out.affinity, other.affinity, out=out.affinity)
        return out

    def copy(self) -> ClusterArrays:
        clone = ClusterArrays(
            node_ids=self.node_ids,
            gpu_ids=self.gpu_ids,
            models=self.models,
            model_idx=self.model_idx,
            gpu_model=self.gpu_model,
            cpu_cap=self.cpu_cap,
            mem_cap=self.mem_cap,
            cpu_free=self.cpu_free.copy(),
            mem_free=self.mem_free.copy(),
            gpu_count=self.gpu_count,
            gpu_free=self.gpu_free.copy(),
            gpu_mem_total=self.gpu_mem_total,
            gpu_mem_free=self.gpu_mem_free.copy(),
            gpu_usable=self.gpu_usable,
            mig_capable=self.mig_capable,
            mig_used=self.mig_used.copy(),
            mig_media=self.mig_media.copy(),
            node_ok=self.node_ok.copy(),
            affinity=self.affinity.copy(),
            tie_rank=self.tie_rank,
        )
        clone.version = self.version.copy()
        return clone
