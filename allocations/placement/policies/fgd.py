"""``fgd``: Fragmentation Gradient Descent (Weng et al., USENIX ATC '23).

Place the demand where the node's expected fragmentation ``F_n`` (see
:mod:`allocations.placement.fragmentation`) grows least. Score, as in the reference::

    int(100 * sigmoid((F_before - F_after) / 1000))

For a fractional demand every fitting GPU is tried and the best one (lowest index on
ties) is both the node's score and the GPU it takes; whole GPUs take the first free ones.
The integer score makes many nodes tie; the engine breaks ties by node order, which the
reference does too (and without which FGD loses most of its advantage).
"""

from __future__ import annotations

import numpy as np

from ..arrays import ClusterArrays
from ..fragmentation import FragmentTerms, ShapeTable
from ..requests import Demand, Kind
from .base import MAX_SCORE, Evaluation, Policy, PolicyContext, mig_pack_scores


def sigmoid(x: np.ndarray) -> np.ndarray:
    # exp overflows for very negative x; the limit there is 0, which clip gives without warnings.
    return 1.0 / (1.0 + np.exp(-np.clip(x, -700.0, 700.0)))


def fragment_deltas(
    arrays: ClusterArrays, demand: Demand, nodes: np.ndarray, fit: np.ndarray, table: ShapeTable
) -> tuple[np.ndarray, FragmentTerms]:
    """``F_after - F_before`` per candidate GPU: returns ``(B, G)`` deltas (inf where unusable)
    and the nodes' :class:`FragmentTerms` (their free GPU, CPU and model, for callers that
    add terms of their own without gathering the rows again).

    For whole-GPU and CPU-only demands the delta does not depend on which GPUs are taken
    (the measure only looks at the multiset of free amounts), so column 0 carries the
    node's delta and the other columns stay inf.
    """
    free = arrays.gpu_free[nodes]
    b, g = free.shape
    delta = np.full((b, g), np.inf)
    terms = FragmentTerms(free, arrays.cpu_free[nodes], arrays.model_idx[nodes], table)
    before = terms.value()
    cpu_after = terms.cpu - demand.cpu_milli
    kind = demand.kind
    if kind is Kind.FRACTION:
        # Two GPUs of a node with the same free milli give the same after-state: score the
        # first, leave its twins at inf (they could only tie it, and ties go to the lowest index).
        same = (free[:, :, None] == free[:, None, :]) & fit[:, None, :] & fit[:, :, None]
        earlier_twin = np.triu(np.ones((g, g), dtype=bool), k=1)  # [j, i] with j < i
        duplicate = (same & earlier_twin[None, :, :]).any(axis=1)
        rows, cols = np.nonzero(fit & ~duplicate)
        if rows.size:
            old = free[rows, cols].astype(np.int64)
            after = terms.after_one_gpu(rows, old, old - demand.milli, cpu_after[rows])
            delta[rows, cols] = after - before[rows]
        return delta, terms
    if kind is Kind.WHOLE:
        enough = fit.sum(axis=1) >= demand.num_gpu
        after = terms.after_whole_gpus(demand.num_gpu, cpu_after)
        delta[:, 0] = np.where(enough, after - before, np.inf)
        return delta, terms
    delta[:, 0] = terms.value(cpu=cpu_after) - before
    return delta, terms


class FgdPolicy(Policy):
    name = "fgd"
    reads_memory = False  # host memory only filters (the score cache shares entries across it)
    needs_profile = True
    summary = "least growth of expected fragmentation, integer sigmoid score (paper's FGD)"

    def evaluate(
        self, arrays: ClusterArrays, demand: Demand, nodes: np.ndarray, fit: np.ndarray, ctx: PolicyContext
    ) -> Evaluation:
        if demand.kind is Kind.MIG:
            return Evaluation(scores=mig_pack_scores(arrays, nodes, fit))
        delta, _ = fragment_deltas(arrays, demand, nodes, fit, ctx.shape_table(arrays))
        score = np.where(np.isfinite(delta), np.trunc(sigmoid(-delta / 1000.0) * MAX_SCORE), -np.inf)
        best_col = score.argmax(axis=1)  # first maximum: lowest GPU index on ties
        best = score[np.arange(len(nodes)), best_col]
        slots = best_col if demand.kind is Kind.FRACTION else None
        return Evaluation(scores=best, slots=slots)
