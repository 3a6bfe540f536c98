"""``dot_product``: Tetris-style alignment, as configured in the FGD paper (DotProd).

Each node offers "virtual bins": every partially used GPU that fits a fractional demand
(its own free milli), and the node's fully free GPUs together (their milli). A bin's
vector is ``(free CPU / 128000, bin GPU / 8000)``, the demand's ``(CPU / 128000, GPU / 8000)``.
The score of a bin is ``1 - dot / 2`` (smaller dot product = tighter fit); a node scores
its best bin, x100 truncated, and a fractional demand takes that bin's GPU.
"""

from __future__ import annotations

import numpy as np

from ..arrays import ClusterArrays
from ..requests import MILLI_PER_GPU, Demand, Kind
from .base import MAX_SCORE, Evaluation, Policy, PolicyContext, mig_pack_scores, spec_norms


class DotProductPolicy(Policy):
    name = "dot_product"
    reads_memory = False  # host memory only filters (the score cache shares entries across it)
    summary = "smallest dot product of free and requested (CPU, GPU) (paper's DotProd)"

    def evaluate(
        self, arrays: ClusterArrays, demand: Demand, nodes: np.ndarray, fit: np.ndarray, ctx: PolicyContext
    ) -> Evaluation:
        if demand.kind is Kind.MIG:
            return Evaluation(scores=mig_pack_scores(arrays, nodes, fit))
        cpu_norm, gpu_norm = spec_norms(arrays)
        free = arrays.gpu_free[nodes].astype(np.float64)
        usable = arrays.gpu_usable[nodes]
        req_gpu = float(demand.total_milli)
        cpu_term = (arrays.cpu_free[nodes] / cpu_norm) * (demand.cpu_milli / cpu_norm)
        idle = ((free == MILLI_PER_GPU) & usable).sum(axis=1) * float(MILLI_PER_GPU)
        exclusive_ok = req_gpu <= idle
        exclusive = 1.0 - (cpu_term + (idle / gpu_norm) * (req_gpu / gpu_norm)) / 2.0
        exclusive = np.where(exclusive_ok, exclusive, -np.inf)
        b = len(nodes)
        slots = np.full(b, -1, dtype=np.int64)
        if req_gpu < MILLI_PER_GPU:  # fractional and CPU-only demands may also use partial GPUs
            # A fractional demand may only use GPUs that fit it (memory, model); CPU-only work
            # uses no GPU, so any partial GPU is a bin for scoring.
            bins = fit if demand.kind is Kind.FRACTION else usable
            partial = bins & (free < MILLI_PER_GPU) & (free >= req_gpu)
            per_gpu = 1.0 - (cpu_term[:, None] + (free / gpu_norm) * (req_gpu / gpu_norm)) / 2.0
            per_gpu = np.where(partial, per_gpu, -np.inf)
            best_partial = per_gpu.max(axis=1) if per_gpu.shape[1] else np.full(b, -np.inf)
            partial_slot = per_gpu.argmax(axis=1)
            # Partial bins come before the exclusive bin and a later bin must be strictly better.
            use_partial = best_partial >= exclusive
            best = np.where(use_partial, best_partial, exclusive)
            if demand.kind is Kind.FRACTION:
                first_idle = np.where(fit & (arrays.gpu_free[nodes] == MILLI_PER_GPU), 1, 0).argmax(axis=1)
                slots = np.where(use_partial & np.isfinite(best_partial), partial_slot, first_idle)
                slots = np.where(np.isfinite(best), slots, -1)
        else:
            best = exclusive
        scores = np.where(np.isfinite(best), np.trunc(MAX_SCORE * best), -1.0)
        return Evaluation(scores=scores, slots=slots if demand.kind is Kind.FRACTION else None)
