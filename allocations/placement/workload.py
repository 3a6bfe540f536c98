"""What the cluster's work usually looks like: the statistics the fragmentation-aware policies use.

A :class:`WorkloadProfile` is built from past (or queued) demands and holds

* the *typical shapes* and their frequencies (the FGD measure's ``p_m``);
* how much CPU and memory GPU work brings per milli-GPU (to see when a node's free GPUs
  are about to be stranded by a lack of CPU or memory);
* the fractional sizes common enough to be relied on as future fillers, and from them the
  *remnant waste* table ``W[f]``: the least milli-GPU a GPU with ``f`` free would still
  leave idle if only those sizes (or whole-GPU work) arrived for it.

``W`` is what lets the ``portal`` policy tell a good remnant from a bad one: 530 milli
left next to a 470 task is worth keeping (another 470 fills it to 60), 210 left after
470 + 320 is not (nothing common fits it). Rare sizes are excluded on purpose: a 160-milli
task fits the 190 that every 810-milli task leaves, but there are twenty 810s for each
160, so counting on it would make every 190 remnant look fillable.
"""

from __future__ import annotations

import functools
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import numpy as np

from .fragmentation import ShapeTable, TaskShape, typical_shapes
from .mig import mig_compute_milli
from .requests import MILLI_PER_GPU, Demand, Kind, PlacementRequest

#: A fractional size counts as a reliable filler when it is at least this share of fractional work.
FILLER_MIN_SHARE = 0.03
COVERAGE = 0.95


def remnant_waste_table(filler_sizes: Sequence[int]) -> np.ndarray:
    """``W[f]`` for f = 0..1000: the least idle milli reachable from ``f`` free with these sizes.

    ``W[f] = min(f, min over sizes s <= f of W[f - s])``; a whole GPU (1000) always fills.
    """
    sizes = sorted({int(s) for s in filler_sizes if 0 < s < MILLI_PER_GPU} | {MILLI_PER_GPU})
    w = np.arange(MILLI_PER_GPU + 1, dtype=np.float64)
    for f in range(1, MILLI_PER_GPU + 1):
        best = float(f)
        for s in sizes:
            if s > f:
                break
            best = min(best, w[f - s])
        w[f] = best
    return w


def demand_for(request: PlacementRequest) -> Demand:
    """A request as a :class:`Demand`; a MIG profile counts as its compute share of a GPU."""
    mig_milli = 0
    if request.kind is Kind.MIG:
        mig_milli = mig_compute_milli(request.mig_profile or "")
    return Demand.from_request(request, mig_milli=mig_milli)


@dataclass
class WorkloadProfile:
    shapes: list[tuple[TaskShape, float]]
    cpu_per_gpu_milli: float  # CPU millicores GPU work brings per milli-GPU
    mem_per_gpu_milli: float  # MiB GPU work brings per milli-GPU
    fraction_sizes: list[tuple[int, float]]  # (milli, share of fractional tasks), most common first
    filler_min_share: float = FILLER_MIN_SHARE
    _tables: dict[tuple[str, ...], ShapeTable] = field(default_factory=dict, repr=False)
    _waste: np.ndarray | None = field(default=None, repr=False)

    @classmethod
    def from_demands(
        cls, demands: Iterable[Demand], coverage: float = COVERAGE, filler_min_share: float = FILLER_MIN_SHARE
    ) -> WorkloadProfile:
        demands = list(demands)
        shapes = [
            TaskShape(d.cpu_milli, d.milli if d.num_gpu else 0, d.num_gpu, "|".join(sorted(d.allowed_models)))
            for d in demands
        ]
        gpu_work = [d for d in demands if d.num_gpu > 0]
        gpu_milli = sum(d.total_milli for d in gpu_work)
        cpu = sum(d.cpu_milli for d in gpu_work)
        mem = sum(d.memory_mib for d in gpu_work)
        fractions = Counter(d.milli for d in demands if d.num_gpu == 1 and 0 < d.milli < MILLI_PER_GPU)
        total_fr = sum(fractions.values())
        return cls(
            shapes=typical_shapes(shapes, coverage),
            cpu_per_gpu_milli=cpu / gpu_milli if gpu_milli else 0.0,
            mem_per_gpu_milli=mem / gpu_milli if gpu_milli else 0.0,
            fraction_sizes=[(m, c / total_fr) for m, c in sorted(fractions.items(), key=lambda kv: (-kv[1], kv[0]))],
            filler_min_share=filler_min_share,
        )

    @classmethod
    def from_requests(cls, requests: Iterable[PlacementRequest]) -> WorkloadProfile:
        """From portal requests (e.g. the last few months of reservations)."""
        return cls.from_demands(demand_for(r) for r in requests)

    @classmethod
    def default(cls) -> WorkloadProfile:
        """A neutral profile for a portal without history: whole GPUs of 1-8, halves and quarters.

        Ratios: 12 cores and 48 GiB per GPU, a common server balance. Callers with real
        reservation history should use :meth:`from_demands` instead. Built once and shared,
        so its shape tables and remnant table are computed once per process, not per decision.
        """
        return _default_profile()

    @classmethod
    def _build_default(cls) -> WorkloadProfile:
        mix = [(1, 1000, 40), (2, 1000, 10), (4, 1000, 6), (8, 1000, 4), (1, 500, 25), (1, 250, 15)]
        demands: list[Demand] = []
        for num, milli, count in mix:
            cpu = 12 * num * milli
            demands += [Demand(cpu_milli=cpu, memory_mib=48 * num * milli, num_gpu=num, milli=milli)] * count
        return cls.from_demands(demands, coverage=1.0)

    def table(self, models: Sequence[str]) -> ShapeTable:
        """The typical shapes bound to a cluster's model vocabulary (cached)."""
        key = tuple(models)
        table = self._tables.get(key)
        if table is None:
            table = self._tables[key] = ShapeTable(self.shapes, models)
        return table

    @property
    def filler_sizes(self) -> list[int]:
        return [m for m, share in self.fraction_sizes if share >= self.filler_min_share]

    @property
    def remnant_waste(self) -> np.ndarray:
        if self._waste is None:
            self._waste = remnant_waste_table(self.filler_sizes)
        return self._waste


@functools.cache
def _default_profile() -> WorkloadProfile:
    return WorkloadProfile._build_default()
