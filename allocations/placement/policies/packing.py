"""``packing``: GPU Packing from the FGD paper — shared GPUs first, then used nodes, then idle nodes.

Scores (integers, as in the reference; a higher band always beats a lower one):

* the demand fits on an already shared GPU: ``100 - (free% of the GPUs it uses) / 10``, at least 50;
* it must use fully free GPUs of a node already in use: ``50 - GPUs taken``, at least 33;
* the node is entirely idle: ``max(33 - its GPU count, its GPU count)``;
* CPU-only work scores 0 everywhere (node order decides).

The GPUs a demand would use are the tightest fitting ones (fewest free milli first), which
is also the GPU a fractional demand takes.
"""

from __future__ import annotations

import numpy as np

from ..arrays import ClusterArrays
from ..requests import MILLI_PER_GPU, Demand, Kind
from .base import MAX_SCORE, Evaluation, Policy, PolicyContext, mig_pack_scores, tightest_slot


class PackingPolicy(Policy):
    name = "packing"
    reads_memory = False  # host memory only filters (the score cache shares entries across it)
    summary = "shared GPUs, then used nodes, then idle nodes (paper's GPU Packing)"

    def evaluate(
        self, arrays: ClusterArrays, demand: Demand, nodes: np.ndarray, fit: np.ndarray, ctx: PolicyContext
    ) -> Evaluation:
        kind = demand.kind
        if kind is Kind.MIG:
            return Evaluation(scores=mig_pack_scores(arrays, nodes, fit))
        if kind is Kind.CPU_ONLY:
            return Evaluation(scores=np.zeros(len(nodes)))
        free = arrays.gpu_free[nodes]
        fully_free = (free == MILLI_PER_GPU).sum(axis=1)
        idle_node = fully_free == arrays.gpu_usable[nodes].sum(axis=1)  # broken GPUs do not count
        idle_score = np.maximum(MAX_SCORE // 3 - fully_free, fully_free)
        if kind is Kind.FRACTION:
            slot = tightest_slot(free, fit)
            used_free = np.take_along_axis(free, np.maximum(slot, 0)[:, None], axis=1)[:, 0]
            takes_fresh_gpu = used_free == MILLI_PER_GPU
            shared_score = np.maximum(MAX_SCORE - (used_free * 100 // MILLI_PER_GPU) // 10, MAX_SCORE // 2)
            busy_score = np.where(takes_fresh_gpu, np.maximum(MAX_SCORE // 2 - 1, MAX_SCORE // 3), shared_score)
            scores = np.where(idle_node, idle_score, busy_score)
            return Evaluation(scores=scores.astype(np.float64), slots=slot)
        # Whole GPUs only ever use fully free GPUs: the "used node" band.
        busy_score = np.maximum(MAX_SCORE // 2 - demand.num_gpu, MAX_SCORE // 3)
        scores = np.where(idle_node, idle_score, busy_score)
        return Evaluation(scores=scores.astype(np.float64))
