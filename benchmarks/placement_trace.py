"""Loading the Alibaba GPU-sharing trace (cluster-trace-gpu-v2023) and inflating it as the FGD paper does."""

from __future__ import annotations

import csv
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from allocations.placement.arrays import ClusterArrays
from allocations.placement.fragmentation import TaskShape, typical_shapes
from allocations.placement.requests import Demand

REPO_ROOT = Path(__file__).resolve().parent.parent
DATA_DIR = REPO_ROOT.parent / "shared" / "data" / "alibaba-gpu-2023"
DEFAULT_NODES = DATA_DIR / "openb_node_list_gpu_node.csv"
TRACE_FILES = {
    "default": DATA_DIR / "openb_pod_list_default.csv",
    "gpushare40": DATA_DIR / "openb_pod_list_gpushare40.csv",
    "multigpu30": DATA_DIR / "openb_pod_list_multigpu30.csv",
}
DEFAULT_TRACE = TRACE_FILES["default"]

#: GPU memory of the trace's public models (MiB); G1-G3 are undisclosed, so unknown (0).
GPU_MEMORY_MIB = {"T4": 16384, "P100": 16384, "V100M16": 16384, "V100M32": 32768, "A10": 24576}

INFLATION = 1.3


@dataclass
class Trace:
    name: str
    cpu_milli: np.ndarray
    memory_mib: np.ndarray
    num_gpu: np.ndarray
    gpu_milli: np.ndarray  # per GPU, 0 for CPU-only tasks
    gpu_spec: list[str]
    creation: np.ndarray | None  # seconds, None when the file has no times
    deletion: np.ndarray | None
    qos: list[str]

    def __len__(self) -> int:
        return len(self.cpu_milli)

    @property
    def gpu_request(self) -> np.ndarray:
        """Requested milli-GPU per task."""
        return self.num_gpu * self.gpu_milli

    def demand(self, i: int) -> Demand:
        spec = self.gpu_spec[i]
        return Demand(
            cpu_milli=int(self.cpu_milli[i]),
            memory_mib=int(self.memory_mib[i]),
            num_gpu=int(self.num_gpu[i]),
            milli=int(self.gpu_milli[i]),
            allowed_models=frozenset(m for m in spec.split("|") if m),
        )

    def shapes(self) -> list[TaskShape]:
        return [
            TaskShape(int(c), int(g), int(n), s)
            for c, g, n, s in zip(self.cpu_milli, self.gpu_milli, self.num_gpu, self.gpu_spec, strict=True)
        ]

    def typical_shapes(self, coverage: float = 0.95) -> list[tuple[TaskShape, float]]:
        return typical_shapes(self.shapes(), coverage)


def load_trace(path: str | Path) -> Trace:
    path = Path(path)
    with path.open(newline="") as fh:
        rows = list(csv.DictReader(fh))
    num = np.array([int(r["num_gpu"]) for r in rows], dtype=np.int64)
    milli = np.array([int(r["gpu_milli"]) for r in rows], dtype=np.int64)
    milli = np.where(num > 0, milli, 0)
    has_times = bool(rows) and "creation_time" in rows[0] and rows[0].get("creation_time") not in (None, "")

    def times(col: str) -> np.ndarray:
        return np.array([float(r[col]) if r.get(col) not in (None, "") else np.nan for r in rows])

    return Trace(
        name=path.stem.replace("openb_pod_list_", ""),
        cpu_milli=np.array([int(r["cpu_milli"]) for r in rows], dtype=np.int64),
        memory_mib=np.array([int(r["memory_mib"]) for r in rows], dtype=np.int64),
        num_gpu=num,
        gpu_milli=milli,
        gpu_spec=[(r.get("gpu_spec") or "").strip() for r in rows],
        creation=times("creation_time") if has_times else None,
        deletion=times("deletion_time") if has_times else None,
        qos=[r.get("qos") or "" for r in rows],
    )


def load_nodes(path: str | Path) -> ClusterArrays:
    """The GPU node list as an empty cluster (node order = file order)."""
    path = Path(path)
    with path.open(newline="") as fh:
        rows = list(csv.DictReader(fh))
    models = [[r["model"]] * int(r["gpu"]) for r in rows]
    return ClusterArrays.build(
        node_ids=[r["sn"] for r in rows],
        cpu_milli=[int(r["cpu_milli"]) for r in rows],
        memory_mib=[int(r["memory_mib"]) for r in rows],
        gpu_models=models,
        gpu_memory_mib=[[GPU_MEMORY_MIB.get(m, 0) for m in ms] for ms in models],
    )


def inflated_order(
    trace: Trace, capacity_milli: int, rng: np.random.Generator, factor: float = INFLATION
) -> np.ndarray:
    """Task indexes in arrival order: the trace shuffled, then uniform draws (with replacement)
    appended until the next draw would push the requested GPU past ``factor`` x capacity."""
    order = list(rng.permutation(len(trace)))
    request = trace.gpu_request
    total = int(request.sum())
    limit = factor * capacity_milli
    while True:
        j = int(rng.integers(len(trace)))
        if total + request[j] > limit:
            break
        order.append(j)
        total += int(request[j])
    return np.asarray(order, dtype=np.int64)
