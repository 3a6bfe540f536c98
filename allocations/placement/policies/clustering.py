"""``clustering``: GPU Clustering from the FGD paper — keep tasks of one kind together.

Tags: shared-GPU tasks, n-GPU tasks (one tag per n), MIG tasks. Bands (integer scores):

* the node hosts only this tag: 75-100;  * this tag among others: 50-75;
* an idle node (no GPU tasks): 25-50;    * only other tags: 0-25;

within a band ``25 * (8000 - free milli on the node) / 8000`` (integer division) prefers
fuller nodes. CPU-only work scores 0. A fractional demand takes the tightest fitting GPU.
"""

from __future__ import annotations

import numpy as np

from ..arrays import ClusterArrays, affinity_column
from ..requests import Demand, Kind
from .base import MAX_SCORE, Evaluation, Policy, PolicyContext, spec_norms, tightest_slot


class ClusteringPolicy(Policy):
    name = "clustering"
    reads_memory = False  # host memory only filters (the score cache shares entries across it)
    summary = "co-locate tasks with the same GPU demand (paper's GPU Clustering)"

    def evaluate(
        self, arrays: ClusterArrays, demand: Demand, nodes: np.ndarray, fit: np.ndarray, ctx: PolicyContext
    ) -> Evaluation:
        tag = affinity_column(demand)
        if tag is None:
            return Evaluation(scores=np.zeros(len(nodes)))
        _, gpu_norm = spec_norms(arrays)
        g = int(gpu_norm)
        quarter = MAX_SCORE // 4
        left = arrays.gpu_free[nodes].sum(axis=1).astype(np.int64)
        fullness = quarter * (g - left) // g
        tags = arrays.affinity[nodes]
        same = tags[:, tag] > 0
        n_tags = (tags > 0).sum(axis=1)
        band = np.where(same, np.where(n_tags == 1, 3, 2), np.where(n_tags == 0, 1, 0))
        scores = (fullness + band * quarter).astype(np.float64)
        slots = tightest_slot(arrays.gpu_free[nodes], fit) if demand.kind is Kind.FRACTION else None
        return Evaluation(scores=scores, slots=slots)
