"""Which nodes and GPUs can take a demand at all (the filter step before scoring).

A node is feasible when it is healthy and schedulable, carries the required labels, has
the CPU and memory free, and has GPUs that fit:

* whole GPUs: at least ``num_gpu`` completely free GPUs (1000 milli, enough memory);
* a fraction: one GPU with ``free >= milli`` and enough free memory;
* MIG: one MIG-capable GPU offering the profile with a free legal start slice;
* CPU-only: no GPU condition.

GPU-level conditions shared by all kinds: usable (present and healthy), model allowed,
total memory at least ``min_gpu_memory_mib``.
"""

from __future__ import annotations

import numpy as np

from .arrays import ClusterArrays
from .mig import profiles_for
from .requests import MILLI_PER_GPU, Demand, Kind


def eligible_gpus(arrays: ClusterArrays, demand: Demand, nodes: np.ndarray | slice = slice(None)) -> np.ndarray:
    """(B, G) bool: GPUs that may serve the demand whatever they currently hold."""
    ok = arrays.gpu_usable[nodes]
    if demand.allowed_models:
        ok = ok & arrays.model_mask(demand.allowed_models)[arrays.gpu_model[nodes]]
    if demand.min_gpu_memory_mib:
        ok = ok & (arrays.gpu_mem_total[nodes] >= demand.min_gpu_memory_mib)
    return ok


def mig_fit(arrays: ClusterArrays, demand: Demand, nodes: np.ndarray | slice = slice(None)) -> np.ndarray:
    """(B, G) bool: MIG-capable GPUs where ``demand.mig_profile`` has a free legal start."""
    gpu_model = arrays.gpu_model[nodes]
    used = arrays.mig_used[nodes].astype(np.int64)
    media = arrays.mig_media[nodes]
    fit = np.zeros(gpu_model.shape, dtype=bool)
    for mi, model in enumerate(arrays.models):
        profile = profiles_for(model).get(demand.mig_profile or "")
        if profile is None:
            continue
        on_model = gpu_model == mi
        if not on_model.any():
            continue
        any_start = np.zeros(gpu_model.shape, dtype=bool)
        for s in profile.starts:
            any_start |= (used & profile.mask(s)) == 0
        if profile.single_per_gpu:
            any_start &= ~media
        fit |= on_model & any_start
    return fit & arrays.mig_capable[nodes]


def gpu_fit(arrays: ClusterArrays, demand: Demand, nodes: np.ndarray | slice = slice(None)) -> np.ndarray:
    """(B, G) bool: GPUs that can take one GPU's worth of the demand right now."""
    kind = demand.kind
    if kind is Kind.CPU_ONLY:
        return np.zeros(arrays.gpu_free[nodes].shape, dtype=bool)
    ok = eligible_gpus(arrays, demand, nodes)
    if kind is Kind.MIG:
        return ok & mig_fit(arrays, demand, nodes)
    need = MILLI_PER_GPU if kind is Kind.WHOLE else demand.milli
    ok = ok & (arrays.gpu_free[nodes] >= need)
    if demand.gpu_memory_mib:
        ok = ok & (arrays.gpu_mem_free[nodes] >= demand.gpu_memory_mib)
    return ok


def node_resources_ok(arrays: ClusterArrays, demand: Demand, nodes: np.ndarray | slice = slice(None)) -> np.ndarray:
    """(B,) bool: healthy, schedulable, CPU and memory free."""
    return (
        arrays.node_ok[nodes]
        & (arrays.cpu_free[nodes] >= demand.cpu_milli)
        & (arrays.mem_free[nodes] >= demand.memory_mib)
    )


def feasible_nodes(
    arrays: ClusterArrays, demand: Demand, label_mask: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """Indexes of feasible nodes and their ``(B, G)`` GPU fit masks."""
    ok = node_resources_ok(arrays, demand)
    if label_mask is not None:
        ok &= label_mask
    if demand.kind is Kind.CPU_ONLY:
        idx = np.flatnonzero(ok)
        return idx, np.zeros((len(idx), arrays.max_gpus), dtype=bool)
    idx = np.flatnonzero(ok)
    fit = gpu_fit(arrays, demand, idx)
    enough = fit.sum(axis=1) >= demand.num_gpu
    return idx[enough], fit[enough]
