"""Small hand-made clusters for the placement tests (no database, no Django)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pytest

from allocations.placement import ClusterState, GpuInfo, NodeInfo
from allocations.placement.arrays import ClusterArrays
from allocations.placement.policies.base import PolicyContext
from allocations.placement.requests import Demand
from allocations.placement.workload import WorkloadProfile

A100 = "A100-SXM4-80GB"


def make_node(
    node_id: str,
    n_gpus: int,
    model: str = A100,
    *,
    cpu: int = 64_000,
    mem: int = 512 * 1024,
    gpu_mem: int = 81_920,
    mig: bool = False,
    labels: dict[str, str] | None = None,
    healthy: bool = True,
) -> NodeInfo:
    gpus = tuple(
        GpuInfo(id=f"{node_id}-g{i}", index=i, model=model, memory_mib=gpu_mem, mig_capable=mig) for i in range(n_gpus)
    )
    return NodeInfo(id=node_id, cpu_milli=cpu, memory_mib=mem, gpus=gpus, labels=labels or {}, healthy=healthy)


def arrays_of(
    free: Sequence[Sequence[int]],
    cpu_free: Sequence[int] | None = None,
    cpu_cap: int = 96_000,
    model: str = "G2",
    mem: int = 512 * 1024,
) -> ClusterArrays:
    """Arrays for nodes whose GPUs have the given free milli (cpu_free defaults to cpu_cap)."""
    arrays = ClusterArrays.build(
        node_ids=[f"n{i}" for i in range(len(free))],
        cpu_milli=[cpu_cap] * len(free),
        memory_mib=[mem] * len(free),
        gpu_models=[[model] * len(f) for f in free],
    )
    for i, f in enumerate(free):
        arrays.gpu_free[i, : len(f)] = f
    if cpu_free is not None:
        arrays.cpu_free[:] = cpu_free
    return arrays


def ctx_for(demands: Sequence[Demand] | None = None, seed: int = 0) -> PolicyContext:
    profile = WorkloadProfile.from_demands(demands) if demands else WorkloadProfile.default()
    return PolicyContext(rng=np.random.default_rng(seed), profile=profile)


@pytest.fixture
def small_state() -> ClusterState:
    """Three 4-GPU A100 nodes; the first two in zone a."""
    return ClusterState(
        [
            make_node("n0", 4, labels={"zone": "a"}, mig=True),
            make_node("n1", 4, labels={"zone": "a"}, mig=True),
            make_node("n2", 4, labels={"zone": "b"}, mig=True),
        ]
    )
