"""``first_fit``: the first feasible node in the cluster's order, the lowest-index GPU that fits.

What the portal's foundation seam did before this engine: predictable, no packing effort.
"""

from __future__ import annotations

import numpy as np

from ..arrays import ClusterArrays
from ..requests import Demand
from .base import Evaluation, Policy, PolicyContext, first_slot


class FirstFitPolicy(Policy):
    name = "first_fit"
    reads_memory = False  # host memory only filters (the score cache shares entries across it)
    summary = "first feasible node in order, lowest-index fitting GPU"

    def evaluate(
        self, arrays: ClusterArrays, demand: Demand, nodes: np.ndarray, fit: np.ndarray, ctx: PolicyContext
    ) -> Evaluation:
        # Every node scores the same, so the engine's tie-break (node order) decides.
        return Evaluation(scores=np.zeros(len(nodes)), slots=first_slot(fit))

    def fraction_slots(
        self, arrays: ClusterArrays, nodes: np.ndarray, fit: np.ndarray, ctx: PolicyContext
    ) -> np.ndarray:
        return first_slot(fit)
