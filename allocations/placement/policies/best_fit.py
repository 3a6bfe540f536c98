"""``best_fit``: the node left with the least free CPU and GPU (the FGD paper's BestFit).

Score, with free amounts measured before placing and the reference's normalisers
(128 cores, 8 GPUs)::

    100 * (1 - [0.5 * (free_cpu - cpu) / 128000 + 0.5 * (free_gpu - gpu) / 8000])

truncated to an integer as the reference does (so ties are common and the node order
breaks them). A fractional demand takes the tightest-fitting GPU.
"""

from __future__ import annotations

import numpy as np

from ..arrays import ClusterArrays
from ..requests import Demand, Kind
from .base import MAX_SCORE, Evaluation, Policy, PolicyContext, mig_pack_scores, spec_norms, tightest_slot


class BestFitPolicy(Policy):
    name = "best_fit"
    reads_memory = False  # host memory only filters (the score cache shares entries across it)
    summary = "least CPU+GPU left after placing (paper's BestFit)"

    def evaluate(
        self, arrays: ClusterArrays, demand: Demand, nodes: np.ndarray, fit: np.ndarray, ctx: PolicyContext
    ) -> Evaluation:
        if demand.kind is Kind.MIG:
            return Evaluation(scores=mig_pack_scores(arrays, nodes, fit))
        cpu_norm, gpu_norm = spec_norms(arrays)
        free_gpu = arrays.gpu_free[nodes].sum(axis=1).astype(np.float64)
        # Same operation order as the reference so the integer truncation lands identically.
        left = (arrays.cpu_free[nodes] - demand.cpu_milli) / cpu_norm * 0.5
        left = left + (free_gpu - demand.total_milli) / gpu_norm * 0.5
        scores = np.trunc((1.0 - left) * MAX_SCORE)
        return Evaluation(scores=scores, slots=tightest_slot(arrays.gpu_free[nodes], fit))
