"""A synthetic cluster of any size, drawn from the real node list, for latency at scale."""

from __future__ import annotations

import numpy as np

from allocations.placement.arrays import ClusterArrays


def synthetic_cluster(template: ClusterArrays, n_nodes: int, seed: int = 0) -> ClusterArrays:
    """``n_nodes`` nodes sampled (with replacement) from ``template``'s node types.

    Keeps the real mix of models, CPU/GPU and memory/GPU ratios, so the trace's tasks
    fit it the same way they fit the real cluster.
    """
    rng = np.random.default_rng(seed)
    pick = rng.integers(template.n_nodes, size=n_nodes)
    models = [[template.models[int(m)] for m in template.gpu_model[i, : template.gpu_count[i]]] for i in pick]
    return ClusterArrays.build(
        node_ids=[f"synthetic-{k:05d}" for k in range(n_nodes)],
        cpu_milli=template.cpu_cap[pick],
        memory_mib=template.mem_cap[pick],
        gpu_models=models,
        gpu_memory_mib=[list(template.gpu_mem_total[i, : template.gpu_count[i]]) for i in pick],
    )
