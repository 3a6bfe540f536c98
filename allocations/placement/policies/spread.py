"""``spread``: the least allocated node, like kube-scheduler's LeastAllocated.

Score = mean over CPU, memory and GPU of the fraction left free after placing (x100).
Spreading keeps every node half empty: good for burst headroom and blast radius, bad for
big jobs — it is here as the opposite pole to packing. A fractional demand takes the
emptiest fitting GPU.
"""

from __future__ import annotations

import numpy as np

from ..arrays import ClusterArrays
from ..requests import Demand, Kind
from .base import MAX_SCORE, Evaluation, Policy, PolicyContext, loosest_slot, mig_pack_scores


class SpreadPolicy(Policy):
    name = "spread"
    summary = "least allocated node (kube-scheduler LeastAllocated)"

    def evaluate(
        self, arrays: ClusterArrays, demand: Demand, nodes: np.ndarray, fit: np.ndarray, ctx: PolicyContext
    ) -> Evaluation:
        if demand.kind is Kind.MIG:
            return Evaluation(scores=mig_pack_scores(arrays, nodes, fit, spread=True))
        cpu = (arrays.cpu_free[nodes] - demand.cpu_milli) / np.maximum(arrays.cpu_cap[nodes], 1)
        mem = (arrays.mem_free[nodes] - demand.memory_mib) / np.maximum(arrays.mem_cap[nodes], 1)
        gpu_cap = arrays.gpu_count[nodes].astype(np.float64) * 1000.0
        gpu_left = arrays.gpu_free[nodes].sum(axis=1) - demand.total_milli
        gpu = np.where(gpu_cap > 0, gpu_left / np.maximum(gpu_cap, 1.0), 1.0)
        scores = (cpu + mem + gpu) / 3.0 * MAX_SCORE
        return Evaluation(scores=scores, slots=loosest_slot(arrays.gpu_free[nodes], fit))

    def fraction_slots(
        self, arrays: ClusterArrays, nodes: np.ndarray, fit: np.ndarray, ctx: PolicyContext
    ) -> np.ndarray:
        return loosest_slot(arrays.gpu_free[nodes], fit)
