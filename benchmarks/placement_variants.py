"""Workload variants of the default Alibaba trace, resampled the way the FGD paper builds its.

    python -m benchmarks.placement_variants [--split train|heldout|all] [--out DIR] [--json OUT]

The paper keeps the cluster and the trace's tasks and changes one thing about the mix at
a time by resampling. We do the same, from ``openb_pod_list_default.csv`` only:

* ``gpuspecNN``: NN% of the GPU tasks (by count) are restricted to GPU models. Each
  chosen task gets one model (three times in four) or two, drawn from the models that have
  a node it fits on, weighted by those models' GPU capacity, so a pin never makes a task
  impossible and the big G2 fleet gets most pins, as a real cluster would.
* ``gpushareNN``: tasks that share a GPU make NN% of the GPU request (milli-GPU); GPU tasks
  are drawn with replacement from the sharing and the non-sharing tasks until each part
  reaches its share of the trace's total request (the paper's ``gpushare40`` has 40%).
* ``multigpuNN``: the same with multi-GPU tasks (the paper's ``multigpu30``).
* ``cpuheavyNN``: the same with CPU-hungry GPU tasks (more CPU per milli-GPU than the
  trace's median, 11.4 cores per GPU), i.e. more or less CPU per task; 35% in the trace.

CPU-only tasks are kept as they are. Every variant is drawn from its own fixed seed, so
a name always means the same tasks. Levels are split into *training* variants (the
sweep in :mod:`benchmarks.placement_sweep` chooses the policy's constants on them) and
*held-out* variants (reported, never used to choose).
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
import zlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .placement_trace import DEFAULT_NODES, DEFAULT_TRACE, Trace, load_nodes, load_trace


@dataclass(frozen=True)
class Variant:
    kind: str  # gpuspec, gpushare, multigpu, cpuheavy
    level: int  # percent
    split: str  # train or heldout

    @property
    def name(self) -> str:
        return f"{self.kind}{self.level}"


#: (kind, training levels, held-out levels). Held-out levels sit between training ones
#: and, for the pinned mixes the issue is about, one beyond them (50%).
LEVELS: tuple[tuple[str, tuple[int, ...], tuple[int, ...]], ...] = (
    ("gpuspec", (10, 25, 40), (20, 33, 50)),
    ("gpushare", (20, 50, 80), (35, 65)),
    ("multigpu", (10, 30, 50), (20, 40)),
    ("cpuheavy", (5, 35, 65), (20, 50, 80)),
)

VARIANTS: tuple[Variant, ...] = tuple(
    Variant(kind, level, split)
    for kind, train, held in LEVELS
    for split, levels in (("train", train), ("heldout", held))
    for level in levels
)
BY_NAME = {v.name: v for v in VARIANTS}

#: A GPU task is CPU-hungry above this many CPU millicores per milli-GPU (the default trace's median).
CPU_HEAVY_RATIO = 11.4


def variants(split: str = "all") -> list[Variant]:
    if split == "all":
        return list(VARIANTS)
    if split not in ("train", "heldout"):
        raise ValueError(f"split must be train, heldout or all, not {split!r}")
    return [v for v in VARIANTS if v.split == split]


def _subset(trace: Trace, idx: np.ndarray, name: str, gpu_spec: list[str] | None = None) -> Trace:
    return Trace(
        name=name,
        cpu_milli=trace.cpu_milli[idx].copy(),
        memory_mib=trace.memory_mib[idx].copy(),
        num_gpu=trace.num_gpu[idx].copy(),
        gpu_milli=trace.gpu_milli[idx].copy(),
        gpu_spec=gpu_spec if gpu_spec is not None else [trace.gpu_spec[i] for i in idx],
        creation=None,
        deletion=None,
        qos=[trace.qos[i] for i in idx],
    )


def _draw_until(pool: np.ndarray, request: np.ndarray, target: float, rng: np.random.Generator) -> list[int]:
    """Tasks drawn with replacement from ``pool`` while their summed request stays within ``target``."""
    out: list[int] = []
    total = 0
    if pool.size == 0:
        return out
    misses = 0
    while misses < 50:
        j = int(pool[rng.integers(pool.size)])
        if total + int(request[j]) > target:
            misses += 1  # a big task overshoots; a few smaller draws may still fit
            continue
        out.append(j)
        total += int(request[j])
    return out


def resample_share(trace: Trace, in_class: np.ndarray, share: float, rng: np.random.Generator, name: str) -> Trace:
    """GPU tasks resampled so ``in_class`` tasks make ``share`` of the (unchanged) total GPU request."""
    request = trace.gpu_request
    gpu = trace.num_gpu > 0
    total = float(request[gpu].sum())
    chosen = _draw_until(np.flatnonzero(gpu & in_class), request, share * total, rng)
    chosen += _draw_until(np.flatnonzero(gpu & ~in_class), request, (1.0 - share) * total, rng)
    idx = np.concatenate([np.flatnonzero(~gpu), np.asarray(chosen, dtype=np.int64)])
    return _subset(trace, rng.permutation(idx), name)


def pin_models(trace: Trace, share: float, rng: np.random.Generator, name: str, nodes_path: Path = DEFAULT_NODES) -> Trace:
    """``share`` of the GPU tasks (by count) restricted to one or two GPU models they fit on."""
    nodes = load_nodes(nodes_path)
    models = nodes.models
    midx = nodes.model_idx.astype(np.int64)
    gpus = nodes.gpu_count.astype(np.int64)
    spec = list(trace.gpu_spec)
    gpu_tasks = np.flatnonzero(trace.num_gpu > 0)
    pinned = rng.choice(gpu_tasks, size=int(round(share * gpu_tasks.size)), replace=False)
    for i in pinned:
        fits = (
            (gpus >= trace.num_gpu[i])
            & (nodes.cpu_cap >= trace.cpu_milli[i])
            & (nodes.mem_cap >= trace.memory_mib[i])
        )
        weight = np.bincount(midx[fits], weights=gpus[fits], minlength=len(models)).astype(np.float64)
        if weight.sum() == 0:
            continue
        k = 2 if (rng.random() < 0.25 and (weight > 0).sum() >= 2) else 1
        pick = rng.choice(len(models), size=k, replace=False, p=weight / weight.sum())
        spec[i] = "|".join(sorted(models[int(m)] for m in pick))
    return _subset(trace, np.arange(len(trace)), name, gpu_spec=spec)


def make_variant(name: str, base: Trace | None = None) -> Trace:
    """The variant called ``name`` (e.g. ``gpuspec25``), always the same tasks for the same name."""
    v = BY_NAME.get(name)
    if v is None:
        raise ValueError(f"unknown variant {name!r}; choose one of {', '.join(BY_NAME)}")
    base = base if base is not None else load_trace(DEFAULT_TRACE)
    rng = np.random.default_rng(zlib.crc32(name.encode()))
    share = v.level / 100.0
    if v.kind == "gpuspec":
        return pin_models(base, share, rng, name)
    if v.kind == "gpushare":
        cls = (base.num_gpu == 1) & (base.gpu_milli < 1000)
    elif v.kind == "multigpu":
        cls = base.num_gpu > 1
    else:  # cpuheavy
        cls = base.cpu_milli > CPU_HEAVY_RATIO * base.gpu_request
    return resample_share(base, cls, share, rng, name)


def describe(trace: Trace) -> dict:
    request = trace.gpu_request
    gpu = trace.num_gpu > 0
    total = float(request.sum())
    pinned = np.array([bool(s) for s in trace.gpu_spec])
    return {
        "tasks": len(trace),
        "gpu_request_gpus": total / 1000.0,
        "pinned_pct_of_gpu_tasks": 100.0 * float((pinned & gpu).sum()) / max(1, int(gpu.sum())),
        "sharing_pct_of_request": 100.0 * float(request[gpu & (trace.gpu_milli < 1000)].sum()) / total,
        "multigpu_pct_of_request": 100.0 * float(request[trace.num_gpu > 1].sum()) / total,
        "cpu_cores_per_gpu": float(trace.cpu_milli[gpu].sum()) / total,
    }


def write_csv(trace: Trace, path: Path) -> None:
    with path.open("w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["name", "cpu_milli", "memory_mib", "num_gpu", "gpu_milli", "gpu_spec", "qos"])
        for i in range(len(trace)):
            w.writerow(
                [
                    f"{trace.name}-pod-{i:05d}",
                    int(trace.cpu_milli[i]),
                    int(trace.memory_mib[i]),
                    int(trace.num_gpu[i]),
                    int(trace.gpu_milli[i]) if trace.num_gpu[i] else 0,
                    trace.gpu_spec[i],
                    trace.qos[i],
                ]
            )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.placement_variants", description=__doc__.split("\n\n")[0])
    p.add_argument("--split", default="all", choices=["train", "heldout", "all"])
    p.add_argument("--out", help="also write each variant as a pod-list CSV into this folder")
    p.add_argument("--json", default="/tmp/placement-variants.json")
    args = p.parse_args(argv)
    base = load_trace(DEFAULT_TRACE)
    rows = {"default": {"split": "-", **describe(base)}}
    for v in variants(args.split):
        trace = make_variant(v.name, base)
        rows[v.name] = {"split": v.split, **describe(trace)}
        if args.out:
            Path(args.out).mkdir(parents=True, exist_ok=True)
            write_csv(trace, Path(args.out) / f"openb_pod_list_{v.name}.csv")
    print(f"{'variant':12s} {'split':8s} {'tasks':>6s} {'GPUs asked':>10s} {'pinned%':>8s} {'share%':>7s} {'multi%':>7s} {'cores/GPU':>9s}")
    for name, r in rows.items():
        print(
            f"{name:12s} {r['split']:8s} {r['tasks']:6d} {r['gpu_request_gpus']:10.0f} {r['pinned_pct_of_gpu_tasks']:8.1f} "
            f"{r['sharing_pct_of_request']:7.1f} {r['multigpu_pct_of_request']:7.1f} {r['cpu_cores_per_gpu']:9.2f}"
        )
    Path(args.json).write_text(json.dumps(rows, indent=2))
    print(f"wrote {args.json}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
