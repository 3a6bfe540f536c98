"""``random``: any feasible node, uniformly; a fractional demand takes a random fitting GPU.

The paper's weakest baseline (13.70% unallocated on the default trace).
"""

from __future__ import annotations

import numpy as np

from ..arrays import ClusterArrays
from ..requests import Demand
from .base import Evaluation, Policy, PolicyContext, random_slot


class RandomPolicy(Policy):
    name = "random"
    node_local = False  # draws random numbers: never cache its scores
    summary = "uniformly random feasible node and GPU"

    def evaluate(
        self, arrays: ClusterArrays, demand: Demand, nodes: np.ndarray, fit: np.ndarray, ctx: PolicyContext
    ) -> Evaluation:
        # i.i.d. continuous scores make the arg-max a uniform draw among the candidates.
        return Evaluation(scores=ctx.rng.random(len(nodes)), slots=random_slot(fit, ctx.rng))

    def fraction_slots(
        self, arrays: ClusterArrays, nodes: np.ndarray, fit: np.ndarray, ctx: PolicyContext
    ) -> np.ndarray:
        return random_slot(fit, ctx.rng)
