"""The policy interface and the GPU-choice rules policies share.

A policy scores candidate nodes for one demand (higher is better) and, for a fractional
demand, says which GPU of each node it would use. The engine filters first (only
feasible nodes reach a policy), picks the best score, and breaks ties by the cluster's
fixed node order (``ClusterArrays.tie_rank``) — the rule the FGD reference uses and on
which its published numbers depend.

``node_local = True`` promises that a node's score depends on nothing but that node's
row and the demand (every field of it, host memory included, and the GPU fit its
constraints give); the engine's ``ScoreCache`` then caches scores per demand and
recomputes only rows whose ``version`` changed. Policies that draw random numbers or
look at the whole cluster must set it to False (or put that part in ``adjust``). A policy
whose score never reads the demand's host memory says so (``reads_memory = False``) and
the cache shares scores between demands that differ only there (fewer full re-scorings).
A policy whose score reads it in one term can say, per node, whether two demands that
differ only there score alike (:meth:`Policy.memory_changes`, ``sibling_rows``): the cache
then copies those nodes' scores from the other demand's entry instead of scoring them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import ClassVar

import numpy as np

from ..arrays import ClusterArrays
from ..fragmentation import ShapeTable
from ..mig import best_start, occupied_slices
from ..requests import Demand, Kind
from ..workload import WorkloadProfile

#: Normalisers the FGD reference uses for CPU and GPU (its largest node: 128 cores, 8 GPUs).
MAX_SPEC_CPU = 128_000
MAX_SPEC_GPU = 8_000
MAX_SCORE = 100


@dataclass
class PolicyContext:
    """What a policy may need besides the cluster: randomness and the workload's statistics."""

    rng: np.random.Generator = field(default_factory=lambda: np.random.default_rng(0))
    profile: WorkloadProfile = field(default_factory=WorkloadProfile.default)

    def shape_table(self, arrays: ClusterArrays) -> ShapeTable:
        return self.profile.table(arrays.models)


@dataclass
class Evaluation:
    scores: np.ndarray  # (B,) float64, higher is better
    slots: np.ndarray | None = None  # (B,) GPU slot per node for fractional demands, -1 = none


def spec_norms(arrays: ClusterArrays) -> tuple[float, float]:
    """The reference's normalisers, widened if this cluster has bigger nodes (so scores stay >= 0)."""
    cpu = max(MAX_SPEC_CPU, int(arrays.cpu_cap.max(initial=0)))
    gpu = max(MAX_SPEC_GPU, 1000 * int(arrays.gpu_count.max(initial=0)))
    return float(cpu), float(gpu)


# ------------------------------------------------------------------ GPU choice rules
def tightest_slot(free: np.ndarray, fit: np.ndarray) -> np.ndarray:
    """Per row, the fitting GPU with the least free milli (lowest index on ties), -1 if none."""
    key = np.where(fit, free, np.iinfo(np.int32).max)
    slot = key.argmin(axis=1)
    return np.where(fit.any(axis=1), slot, -1)


def loosest_slot(free: np.ndarray, fit: np.ndarray) -> np.ndarray:
    """Per row, the fitting GPU with the most free milli (lowest index on ties), -1 if none."""
    key = np.where(fit, free, -1)
    slot = key.argmax(axis=1)
    return np.where(fit.any(axis=1), slot, -1)


def first_slot(fit: np.ndarray) -> np.ndarray:
    """Per row, the lowest-index fitting GPU, -1 if none."""
    slot = fit.argmax(axis=1)
    return np.where(fit.any(axis=1), slot, -1)


def random_slot(fit: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Per row, a uniformly random fitting GPU, -1 if none."""
    noise = np.where(fit, rng.random(fit.shape), -1.0)
    slot = noise.argmax(axis=1)
    return np.where(fit.any(axis=1), slot, -1)


def whole_slots(fit_row: np.ndarray, num: int) -> list[int]:
    """Whole-GPU demands take the first ``num`` free GPUs by index (as the reference does)."""
    return [int(i) for i in np.flatnonzero(fit_row)[:num]]


def mig_choice(arrays: ClusterArrays, demand: Demand, node: int, fit_row: np.ndarray) -> tuple[int, int]:
    """(slot, start) for a MIG demand on ``node``.

    Prefer the GPU that already has the most slices in use (keep empty GPUs whole for
    whole-GPU jobs), then the start that leaves that GPU least fragmented.
    """
    best: tuple[tuple[int, int], int, int] | None = None
    for slot in np.flatnonzero(fit_row):
        used = int(arrays.mig_used[node, slot])
        model = arrays.models[int(arrays.gpu_model[node, slot])]
        start = best_start(model, demand.mig_profile or "", used, bool(arrays.mig_media[node, slot]))
        if start is None:
            continue
        key = (occupied_slices(used), -int(slot))
        if best is None or key > best[0]:
            best = (key, int(slot), start)
    if best is None:
        raise ValueError("no MIG placement on a node the filter accepted")
    return best[1], best[2]


def mig_pack_scores(arrays: ClusterArrays, nodes: np.ndarray, fit: np.ndarray, spread: bool = False) -> np.ndarray:
    """Node scores for MIG demands: the most-used fitting GPU wins (or the least used, to spread)."""
    used = np.zeros(fit.shape, dtype=np.int64)
    masks = arrays.mig_used[nodes].astype(np.int64)
    for bit in range(8):
        used += (masks >> bit) & 1
    if spread:
        return np.where(fit, 8 - used, -1).max(axis=1).astype(np.float64)
    return np.where(fit, used, -1).max(axis=1).astype(np.float64)


# ------------------------------------------------------------------ the interface
class Policy:
    name: ClassVar[str] = ""
    #: Score of a node depends only on its own row and the demand (cache-safe).
    node_local: ClassVar[bool] = True
    #: ``evaluate`` reads ``demand.memory_mib`` (the score cache keys by it only then; ``adjust``
    #: is never cached and may read it either way). Say False only for a policy that never does.
    reads_memory: ClassVar[bool] = True
    #: From this many rows to re-score on, the score cache first copies the rows :meth:`memory_changes`
    #: says host memory does not change from a sibling's entry (the same demand with another host
    #: memory); 0: never.
    sibling_rows: ClassVar[int] = 0
    #: Uses ``PolicyContext.profile`` (typical shapes, resource ratios).
    needs_profile: ClassVar[bool] = False
    #: One line for ``describe()`` and the benchmark table.
    summary: ClassVar[str] = ""

    def evaluate(
        self, arrays: ClusterArrays, demand: Demand, nodes: np.ndarray, fit: np.ndarray, ctx: PolicyContext
    ) -> Evaluation:
        """Score ``nodes`` (indexes into ``arrays``) for ``demand``; ``fit`` is their (B, G) GPU fit."""
        raise NotImplementedError

    def memory_changes(
        self, arrays: ClusterArrays, demand: Demand, other: Demand, nodes: np.ndarray, ctx: PolicyContext
    ) -> np.ndarray | None:
        """(B,) bool for two demands that differ only in host memory: True where ``nodes[b]``'s score (or GPU
        slot) for ``demand`` may differ from its score for ``other`` in the node's present state; False
        promises ``evaluate`` gives both the same, bit for bit. None: no promise for any node (the default).
        Only called when ``sibling_rows`` is set."""
        return None

    def prepare(self, arrays: ClusterArrays, ctx: PolicyContext) -> None:
        """Do once-per-cluster work (a check, a table) before the first decision. Optional:
        a policy must also work when it is never called. Default: nothing."""

    def adjust(
        self, arrays: ClusterArrays, demand: Demand, nodes: np.ndarray, scores: np.ndarray, ctx: PolicyContext
    ) -> np.ndarray:
        """Scores after a cluster-wide correction, applied after the (node-local, cached) scores.

        ``evaluate`` must stay node-local for the score cache; a term that depends on the
        whole cluster (how full each GPU model is) goes here and is recomputed every decision.
        Default: none.
        """
        return scores

    def fraction_slots(
        self, arrays: ClusterArrays, nodes: np.ndarray, fit: np.ndarray, ctx: PolicyContext
    ) -> np.ndarray:
        """Which GPU a fractional demand takes on each node; default: the tightest fit."""
        return tightest_slot(arrays.gpu_free[nodes], fit)

    def choose_gpus(
        self,
        arrays: ClusterArrays,
        demand: Demand,
        node: int,
        fit_row: np.ndarray,
        slot_hint: int,
        ctx: PolicyContext,
    ) -> tuple[list[int], int | None]:
        """GPU slots (and MIG start) on the chosen node. ``slot_hint`` is the evaluation's slot or -1."""
        kind = demand.kind
        if kind is Kind.CPU_ONLY:
            return [], None
        if kind is Kind.WHOLE:
            return whole_slots(fit_row, demand.num_gpu), None
        if kind is Kind.MIG:
            slot, start = mig_choice(arrays, demand, node, fit_row)
            return [slot], start
        if slot_hint >= 0 and fit_row[slot_hint]:
            return [int(slot_hint)], None
        slot = int(self.fraction_slots(arrays, np.array([node]), fit_row[None, :], ctx)[0])
        return [slot], None

    def __repr__(self) -> str:
        return f"<Policy {self.name}>"


def as_float(scores: Sequence[float] | np.ndarray) -> np.ndarray:
    return np.asarray(scores, dtype=np.float64)
