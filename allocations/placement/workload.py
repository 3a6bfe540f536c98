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


@dataclass(frozen=True)
class TaskKey:
    """A demand as the per-model terms see it: size and model restriction."""

    allowed: frozenset[str]
    cpu_milli: int
    memory_mib: int
    num_gpu: int
    milli: int  # per GPU, 0 for CPU-only


#: A cluster's node types, as the per-model terms need them: (model index, CPU, memory, GPUs, nodes).
NodeTypes = tuple[tuple[int, int, int, int, int], ...]


def node_types(arrays_model_idx: np.ndarray, cpu_cap: np.ndarray, mem_cap: np.ndarray, gpus: np.ndarray) -> NodeTypes:
    rows = np.stack([arrays_model_idx, cpu_cap, mem_cap, gpus]).T.astype(np.int64)
    kinds, counts = np.unique(rows, axis=0, return_counts=True)
    return tuple((int(m), int(c), int(r), int(g), int(n)) for (m, c, r, g), n in zip(kinds, counts, strict=True))


@dataclass(frozen=True)
class WholeNodeWork:
    """Work that only a whole free node can take, and how much of each node type's work it is.

    A task is *whole-node work* when every node type it fits on (its ``allowed_models``
    admit the model, and the type has the CPU, memory and GPUs it asks) has exactly as
    many GPUs as it asks: wherever it goes it needs all of a node's GPUs free (an 8-GPU
    task on a cluster whose largest nodes have 8 GPUs). Fractional and CPU-only work never is.

    ``cpu_milli``, ``memory_mib`` and ``num_gpu`` describe the K distinct such shapes and
    ``request_share[k]`` their share of the GPU request (milli-GPU) of all recorded GPU work.
    ``share[t][k]`` (node type ``t = (model index, cpu, memory, GPUs)``, as in
    :data:`NodeTypes`) is ``min(1, request share * the cluster's GPUs / GPUs of the types
    the task fits)`` summed over the tasks of shape k that fit t: the share of those types'
    GPUs shape k would need if the mix filled the cluster, 0 where k does not fit t. Types
    no whole-node work fits are absent.
    """

    cpu_milli: tuple[int, ...] = ()
    memory_mib: tuple[int, ...] = ()
    num_gpu: tuple[int, ...] = ()
    #: Shape k's share of the GPU request (milli-GPU) of all the recorded GPU work.
    request_share: tuple[float, ...] = ()
    share: dict[tuple[int, int, int, int], tuple[float, ...]] = field(default_factory=dict)


@dataclass
class ModelTerms:
    """The profile's terms per GPU model of one cluster.

    Row ``i`` is built from the work that can run on model ``i``: its ``allowed_models``
    admit the model *and* some node of that model is big enough for it (an 8-GPU task
    asking for 120 cores can only ever use the 128-core 8-GPU servers, whatever its
    ``gpu_spec`` says). Work that cannot use a model never competes for its nodes, so it
    does not shape that model's terms. The last row (index -1: GPU-less nodes) and models
    no recorded work can use take the whole workload's figures.
    """

    cpu_per_gpu: np.ndarray  # (M + 1,)
    mem_per_gpu: np.ndarray  # (M + 1,)
    waste: np.ndarray  # (M + 1, 1001)
    shapes: ShapeTable  # typical shapes per model (ShapeTable.per_model)
    #: (M + 1,) how much of the GPU work that can use the model is tied to it: each task
    #: counts with the share of the cluster's GPUs it *cannot* use (0 for work that runs
    #: anywhere, nearly 1 for work only this model's few nodes can take).
    pinned_share: np.ndarray
    #: (M + 1,) usable GPUs of each model in the cluster (GPU-less nodes: 0).
    gpus: np.ndarray
    #: The work only a whole free node can take, per node type (see :class:`WholeNodeWork`).
    whole: WholeNodeWork = field(default_factory=WholeNodeWork)


@dataclass
class WorkloadProfile:
    shapes: list[tuple[TaskShape, float]]
    cpu_per_gpu_milli: float  # CPU millicores GPU work brings per milli-GPU
    mem_per_gpu_milli: float  # MiB GPU work brings per milli-GPU
    fraction_sizes: list[tuple[int, float]]  # (milli, share of fractional tasks), most common first
    filler_min_share: float = FILLER_MIN_SHARE
    coverage: float = COVERAGE
    #: Every demand's size and restriction, and how often it occurred (for :meth:`model_terms`).
    task_counts: Counter = field(default_factory=Counter)
    _tables: dict[tuple[str, ...], ShapeTable] = field(default_factory=dict, repr=False)
    _waste: np.ndarray | None = field(default=None, repr=False)
    _model_terms: dict[tuple, ModelTerms] = field(default_factory=dict, repr=False)

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
        task_counts = Counter(
            TaskKey(d.allowed_models, d.cpu_milli, d.memory_mib, d.num_gpu, d.milli if d.num_gpu else 0)
            for d in demands
        )
        return cls(
            shapes=typical_shapes(shapes, coverage),
            cpu_per_gpu_milli=cpu / gpu_milli if gpu_milli else 0.0,
            mem_per_gpu_milli=mem / gpu_milli if gpu_milli else 0.0,
            fraction_sizes=[(m, c / total_fr) for m, c in sorted(fractions.items(), key=lambda kv: (-kv[1], kv[0]))],
            filler_min_share=filler_min_share,
            coverage=coverage,
            task_counts=task_counts,
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

    def model_terms(self, models: Sequence[str], types: NodeTypes, filler_min_share: float | None = None) -> ModelTerms:
        """The per-model terms for a cluster's vocabulary and node types (cached).

        ``filler_min_share`` overrides the profile's cut-off for reliable filler sizes.
        """
        share = self.filler_min_share if filler_min_share is None else filler_min_share
        key = (tuple(models), types, share)
        terms = self._model_terms.get(key)
        if terms is None:
            terms = self._model_terms[key] = self._build_model_terms(models, types, share)
        return terms

    def _build_model_terms(self, models: Sequence[str], types: NodeTypes, filler_min_share: float) -> ModelTerms:
        rows = len(models) + 1
        gpus_of = np.zeros(rows)
        for m, _, _, g, n in types:
            if m >= 0:
                gpus_of[m] += g * n
        all_gpus = gpus_of.sum()
        # Per task kind: the models it can run on (allowed and some node of the model fits it).
        usable: list[tuple[TaskKey, int, np.ndarray]] = []
        for key, count in self.task_counts.items():
            can = np.zeros(rows, dtype=bool)
            for m, cpu_cap, mem_cap, g, _ in types:
                if m < 0 or (key.allowed and models[m] not in key.allowed):
                    continue
                if cpu_cap >= key.cpu_milli and mem_cap >= key.memory_mib and g >= key.num_gpu:
                    can[m] = True
            if key.num_gpu == 0:
                can[:] = True  # CPU-only work competes for every node's CPU
            if can.any():
                usable.append((key, count, can))
        cpu = np.full(rows, self.cpu_per_gpu_milli)
        mem = np.full(rows, self.mem_per_gpu_milli)
        waste = np.tile(
            remnant_waste_table([m for m, share in self.fraction_sizes if share >= filler_min_share]), (rows, 1)
        )
        pinned = np.zeros(rows)
        per_model_shapes: list[dict[TaskShape, float]] = []
        for i in range(len(models)):
            on_i = [(k, c, can) for k, c, can in usable if can[i]]
            gpu_work = [(k, c, can) for k, c, can in on_i if k.num_gpu > 0]
            gpu = sum(c * k.num_gpu * k.milli for k, c, _ in gpu_work)
            shapes: Counter = Counter()
            for k, c, _ in on_i:
                shapes[TaskShape(k.cpu_milli, k.milli, k.num_gpu)] += c
            per_model_shapes.append(dict(typical_shapes(shapes.elements(), self.coverage)))
            if gpu == 0:
                continue  # no recorded GPU work can use this model: keep the whole workload's figures
            cpu[i] = sum(c * k.cpu_milli for k, c, _ in gpu_work) / gpu
            mem[i] = sum(c * k.memory_mib for k, c, _ in gpu_work) / gpu
            pinned[i] = (
                sum(c * k.num_gpu * k.milli * (1.0 - gpus_of[can].sum() / all_gpus) for k, c, can in gpu_work) / gpu
            )
            fractions = Counter({k.milli: 0 for k, _, _ in gpu_work if 0 < k.milli < MILLI_PER_GPU})
            for k, c, _ in gpu_work:
                if k.num_gpu == 1 and 0 < k.milli < MILLI_PER_GPU:
                    fractions[k.milli] += c
            total = sum(fractions.values())
            if total:
                waste[i] = remnant_waste_table([m for m, c in fractions.items() if c / total >= filler_min_share])
        union = sorted({s for row in per_model_shapes for s in row}, key=lambda s: (s.cpu_milli, s.gpu_milli, s.num_gpu))
        p = np.zeros((rows, len(union)))
        for i, row in enumerate(per_model_shapes):
            for j, s in enumerate(union):
                p[i, j] = row.get(s, 0.0)
        return ModelTerms(
            cpu_per_gpu=cpu,
            mem_per_gpu=mem,
            waste=waste,
            shapes=ShapeTable.per_model(union, p, models),
            pinned_share=pinned,
            gpus=gpus_of,
            whole=self._whole_node_work(models, types),
        )

    def _whole_node_work(self, models: Sequence[str], types: NodeTypes) -> WholeNodeWork:
        """The recorded work that only a whole free node can take (:class:`WholeNodeWork`)."""

        def fits(key: TaskKey, m: int, cpu_cap: int, mem_cap: int, g: int) -> bool:
            allowed = m >= 0 and (not key.allowed or models[m] in key.allowed)
            return allowed and cpu_cap >= key.cpu_milli and mem_cap >= key.memory_mib and g >= key.num_gpu

        gpu_keys = [(k, c) for k, c in self.task_counts.items() if k.num_gpu > 0 and k.milli > 0]
        shapes: dict[tuple[int, int, int], list[tuple[TaskKey, int]]] = {}
        for key, count in gpu_keys:
            if key.milli < MILLI_PER_GPU:
                continue
            on = [g for m, c, r, g, _ in types if fits(key, m, c, r, g)]
            if on and all(g == key.num_gpu for g in on):
                shapes.setdefault((key.cpu_milli, key.memory_mib, key.num_gpu), []).append((key, count))
        if not shapes:
            return WholeNodeWork()
        order = sorted(shapes)
        all_work = sum(n * k.num_gpu * k.milli for k, n in gpu_keys)
        all_gpus = sum(g * n for m, _, _, g, n in types if m >= 0)
        # Per task kind: the GPUs of the node types it fits (the only ones it can ever use).
        supply = {
            k: sum(g * n for m, c, r, g, n in types if fits(k, m, c, r, g)) for s in order for k, _ in shapes[s]
        }
        share: dict[tuple[int, int, int, int], tuple[float, ...]] = {}
        for m, c, r, g, _ in types:
            t = (m, c, r, g)
            row = tuple(
                min(1.0, sum(
                    n * k.num_gpu * k.milli / all_work * all_gpus / supply[k]
                    for k, n in shapes[s] if fits(k, m, c, r, g)
                ))
                for s in order
            )
            if any(row):
                share[t] = row
        return WholeNodeWork(
            cpu_milli=tuple(s[0] for s in order),
            memory_mib=tuple(s[1] for s in order),
            num_gpu=tuple(s[2] for s in order),
            request_share=tuple(sum(n * k.num_gpu * k.milli for k, n in shapes[s]) / all_work for s in order),
            share=share,
        )

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
