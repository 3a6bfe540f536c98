"""Benchmark the placement policies on Alibaba's GPU-sharing trace, the way the FGD paper does.

    python -m benchmarks.placement [--nodes FILE] [--trace FILE|default|gpushare40|multigpu30|VARIANT]
                                   [--policies a,b,...] [--seeds 42-51] [--json OUT]
                                   [--synthetic-nodes 10000] [--replay-time]
    python -m benchmarks.placement --variants train|heldout|all --policies portal,fgd [--seeds 42-51]

Default: the GPU node list and the default trace from ../shared/data/alibaba-gpu-2023/,
all policies, seeds 42-51. Per seed the trace is shuffled and inflated with sampled tasks
to 1.3x GPU capacity; tasks arrive one at a time, never leave, and are dropped when no
node fits. Reported per policy (means over seeds): unallocated GPU % of capacity when
arrived GPU reaches 100% and 130%, fragmentation % at 90%, decisions per second and the
p50/p99 decision latency. ``--replay-time`` instead replays creation/deletion times with
queueing (see :mod:`benchmarks.placement_timereplay`). ``--variants`` runs the default trace
and the generated workload variants (:mod:`benchmarks.placement_variants`) and tables the
first policy against the second at 90, 100 and 130% arrived.
"""

from __future__ import annotations

import os

# One core, as the issue asks: keep BLAS/OpenMP from spreading the small matrix products.
for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import argparse  # noqa: E402
import functools  # noqa: E402
import json  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402
from collections.abc import Callable  # noqa: E402
from typing import Any  # noqa: E402

import numpy as np  # noqa: E402

from allocations.placement.arrays import ClusterArrays  # noqa: E402
from allocations.placement.fragmentation import ShapeTable  # noqa: E402
from allocations.placement.policies import POLICY_NAMES, Policy, get_policy  # noqa: E402
from allocations.placement.workload import WorkloadProfile  # noqa: E402

from .placement_replay import RunResult, replay  # noqa: E402
from .placement_synthetic import synthetic_cluster  # noqa: E402
from .placement_variants import BY_NAME, make_variant, variants  # noqa: E402
from .placement_trace import DEFAULT_NODES, DEFAULT_TRACE, TRACE_FILES, Trace, load_nodes, load_trace  # noqa: E402

#: Arrived GPU % at which the variant table compares policies.
ARRIVED_POINTS = (90, 100, 130)

#: Published unallocated GPU % at arrived = 100% (FGD paper, mean of 10 seeds; data README).
PUBLISHED = {
    "default": {
        "random": 13.70,
        "dot_product": 9.38,
        "clustering": 8.35,
        "packing": 8.22,
        "best_fit": 7.14,
        "fgd": 4.77,
    },
    "gpushare40": {
        "random": 15.14,
        "dot_product": 10.70,
        "clustering": 10.24,
        "packing": 10.23,
        "best_fit": 8.56,
        "fgd": 6.04,
    },
    "multigpu30": {
        "random": 13.37,
        "dot_product": 6.89,
        "clustering": 5.45,
        "packing": 5.30,
        "best_fit": 5.43,
        "fgd": 3.64,
    },
}


def parse_seeds(text: str) -> list[int]:
    seeds: list[int] = []
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        if "-" in part:
            lo, hi = part.split("-", 1)
            seeds.extend(range(int(lo), int(hi) + 1))
        else:
            seeds.append(int(part))
    return seeds


def resolve_trace(text: str | None) -> Path:
    if text is None:
        return DEFAULT_TRACE
    return TRACE_FILES.get(text, Path(text))


def trace_key(path: Path) -> str:
    return path.stem.replace("openb_pod_list_", "")


def profile_of(trace: Trace) -> WorkloadProfile:
    return WorkloadProfile.from_demands(trace.demand(i) for i in range(len(trace)))


def summarise(runs: list[RunResult]) -> dict[str, Any]:
    lat = [r.latency_s for r in runs]
    decisions = sum(len(x) for x in lat)
    decision_time = sum(float(x.sum()) for x in lat)
    cpu_time = sum(float(r.cpu_s.sum()) for r in runs)
    return {
        "unallocated_pct_at_90": float(np.mean([r.unallocated_at(90) for r in runs])),
        "unallocated_pct_at_100": float(np.mean([r.unallocated_at(100) for r in runs])),
        "unallocated_pct_at_130": float(np.mean([r.unallocated_at(130) for r in runs])),
        "frag_pct_at_90": float(np.mean([r.frag_at(90) for r in runs])),
        "placements_per_s": decisions / decision_time if decision_time else float("inf"),
        # The same in thread CPU time: what the decisions cost, without the time other
        # processes on a loaded machine took the core away.
        "cpu_placements_per_s": decisions / cpu_time if cpu_time else float("inf"),
        "latency_ms_p50": float(np.mean([np.percentile(x, 50) for x in lat]) * 1000),
        "latency_ms_p99": float(np.mean([np.percentile(x, 99) for x in lat]) * 1000),
        "cpu_ms_p50": float(np.mean([np.percentile(r.cpu_s, 50) for r in runs]) * 1000),
        "cpu_ms_p99": float(np.mean([np.percentile(r.cpu_s, 99) for r in runs]) * 1000),
        "unallocated_pct_at_100_sd": float(np.std([r.unallocated_at(100) for r in runs])),
        "failed_tasks": float(np.mean([r.failed for r in runs])),
        "tasks": float(np.mean([len(r.arrived_pct) for r in runs])),
        "wall_s": float(sum(r.wall_s for r in runs)),
        "prepare_s": float(sum(r.prepare_s for r in runs)),
    }


def load_trace_arg(text: str | None) -> tuple[Trace, str, str]:
    """(trace, key, source) for ``--trace``: a file, a shipped trace's name, or a generated variant's name."""
    if text in BY_NAME:
        return make_variant(text), text, f"variant {text} of {DEFAULT_TRACE.name}"
    path = resolve_trace(text)
    return load_trace(path), trace_key(path), str(path)


def compare_policies(
    nodes: ClusterArrays,
    trace: Trace,
    policies: dict[str, Callable[[], Policy]],
    seeds: list[int],
    *,
    use_cache: bool = True,
    verbose: bool = False,
    label: str = "",
) -> dict[str, dict[str, Any]]:
    """Each policy on ``trace`` for every seed: summaries (means over seeds, per-seed figures).

    Seeds are the outer loop, policies the inner one, so policies compared in one run see
    the same drift in machine load (their timings sit side by side, not minutes apart)."""
    profile = profile_of(trace)
    measure = ShapeTable(trace.typical_shapes(), nodes.models)
    out: dict[str, dict[str, Any]] = {}
    all_runs: dict[str, list[RunResult]] = {name: [] for name in policies}
    for seed in seeds:
        for name, make in policies.items():
            all_runs[name].append(replay(nodes, trace, make(), seed, measure, profile, use_cache=use_cache))
            if verbose:
                r = all_runs[name][-1]
                print(f"  {label}{name} seed {seed}: {r.unallocated_at(100):.2f}% ({r.wall_s:.1f}s)", flush=True)
    for name, runs in all_runs.items():
        summary = summarise(runs)
        for pct in ARRIVED_POINTS:
            summary[f"per_seed_unallocated_pct_at_{pct}"] = {str(r.seed): r.unallocated_at(pct) for r in runs}
        out[name] = summary
    return out


def run_trace(args: argparse.Namespace, policies: list[str], seeds: list[int]) -> dict:
    nodes_path = Path(args.nodes) if args.nodes else DEFAULT_NODES
    nodes = load_nodes(nodes_path)
    trace, key, source = load_trace_arg(args.trace)
    measure = ShapeTable(trace.typical_shapes(), nodes.models)
    published = PUBLISHED.get(key, {})
    print(
        f"trace {source}: {len(trace)} tasks; cluster {nodes_path.name}: {nodes.n_nodes} nodes, "
        f"{nodes.gpu_capacity_milli() // 1000} GPUs; {len(measure)} typical shapes; seeds {seeds[0]}..{seeds[-1]}",
        flush=True,
    )
    out: dict = {"trace": source, "nodes": str(nodes_path), "seeds": seeds, "policies": {}}
    started = time.perf_counter()
    makers = {name: functools.partial(get_policy, name) for name in policies}
    results = compare_policies(nodes, trace, makers, seeds, use_cache=not args.no_cache, verbose=args.verbose)
    for name in policies:
        summary = results[name]
        if name in published:
            summary["published_unallocated_pct_at_100"] = published[name]
            summary["delta_vs_published"] = summary["unallocated_pct_at_100"] - published[name]
        out["policies"][name] = summary
        print_row(name, summary, header=len(out["policies"]) == 1)
    out["wall_s"] = time.perf_counter() - started
    print(f"all policies x {len(seeds)} seeds: {out['wall_s']:.0f} s", flush=True)
    return out


def run_variants(args: argparse.Namespace, policies: list[str], seeds: list[int]) -> dict:
    """Every generated variant of a split (see :mod:`benchmarks.placement_variants`), then a
    table of the first policy against the second (``portal`` against ``fgd`` by default)."""
    nodes_path = Path(args.nodes) if args.nodes else DEFAULT_NODES
    nodes = load_nodes(nodes_path)
    base = load_trace(DEFAULT_TRACE)
    chosen = [("default", "-", base)] + [(v.name, v.split, make_variant(v.name, base)) for v in variants(args.variants)]
    makers = {name: functools.partial(get_policy, name) for name in policies}
    out: dict = {"nodes": str(nodes_path), "seeds": seeds, "split": args.variants, "variants": {}}
    started = time.perf_counter()
    for name, split, trace in chosen:
        result = compare_policies(
            nodes, trace, makers, seeds, use_cache=not args.no_cache, verbose=args.verbose, label=f"{name} "
        )
        out["variants"][name] = {"split": split, "policies": result}
        print(f"{name} ({split}): " + ", ".join(
            f"{p} {s['unallocated_pct_at_100']:.2f}" for p, s in result.items()), flush=True)
    out["wall_s"] = time.perf_counter() - started
    if len(policies) >= 2:
        out["comparison"] = print_comparison(out["variants"], policies[0], policies[1], seeds)
    return out


def print_comparison(results: dict, ours: str, base: str, seeds: list[int]) -> dict:
    """Per variant: unallocated % of ``ours`` and ``base`` at 90/100/130% arrived, the ratio at 100%
    and on how many seeds ``ours`` is strictly lower at 100%."""
    print(
        f"\n{'variant':12s} {'split':8s} "
        + " ".join(f"{ours[:6]}@{p:<3d} {base[:6]}@{p:<3d}" for p in ARRIVED_POINTS)
        + f" {'ratio@100':>9s} {'wins@100':>8s}"
    )
    table = {}
    for name, entry in results.items():
        a, b = entry["policies"][ours], entry["policies"][base]
        row = {"split": entry["split"]}
        for p in ARRIVED_POINTS:
            row[f"{ours}_at_{p}"] = a[f"unallocated_pct_at_{p}"]
            row[f"{base}_at_{p}"] = b[f"unallocated_pct_at_{p}"]
        row["ratio_at_100"] = a["unallocated_pct_at_100"] / b["unallocated_pct_at_100"]
        per_a, per_b = a["per_seed_unallocated_pct_at_100"], b["per_seed_unallocated_pct_at_100"]
        row["seeds_won_at_100"] = sum(per_a[s] < per_b[s] for s in per_a)
        table[name] = row
        print(
            f"{name:12s} {entry['split']:8s} "
            + " ".join(f"{row[f'{ours}_at_{p}']:10.2f} {row[f'{base}_at_{p}']:10.2f}" for p in ARRIVED_POINTS)
            + f" {row['ratio_at_100']:9.3f} {row['seeds_won_at_100']:4d}/{len(seeds):<3d}"
        )
    worst = max(table, key=lambda k: table[k]["ratio_at_100"])
    print(f"worst ratio at 100%: {table[worst]['ratio_at_100']:.3f} ({worst})", flush=True)
    return table


def print_row(name: str, s: dict, header: bool) -> None:
    if header:
        print(
            f"{'policy':12s} {'unalloc@100':>11s} {'±sd':>5s} {'published':>9s} {'delta':>6s} {'unalloc@130':>11s} "
            f"{'frag@90':>8s} {'decisions/s':>11s} {'cpu dec/s':>9s} {'p50 ms':>7s} {'p99 ms':>7s} {'cpu p99':>7s}"
        )
    pub = s.get("published_unallocated_pct_at_100")
    pub_s = f"{pub:9.2f}" if pub is not None else f"{'-':>9s}"
    delta_s = f"{s['delta_vs_published']:+6.2f}" if pub is not None else f"{'-':>6s}"
    print(
        f"{name:12s} {s['unallocated_pct_at_100']:11.2f} {s['unallocated_pct_at_100_sd']:5.2f} {pub_s} {delta_s} "
        f"{s['unallocated_pct_at_130']:11.2f} {s['frag_pct_at_90']:8.2f} {s['placements_per_s']:11.0f} "
        f"{s['cpu_placements_per_s']:9.0f} "
        f"{s['latency_ms_p50']:7.3f} {s['latency_ms_p99']:7.3f} {s['cpu_ms_p99']:7.3f}",
        flush=True,
    )


def run_synthetic(args: argparse.Namespace, policies: list[str], seeds: list[int]) -> dict:
    nodes_path = Path(args.nodes) if args.nodes else DEFAULT_NODES
    trace_path = resolve_trace(args.trace)
    template = load_nodes(nodes_path)
    nodes = synthetic_cluster(template, args.synthetic_nodes, seed=seeds[0])
    trace = load_trace(trace_path)
    profile = profile_of(trace)
    measure = ShapeTable(trace.typical_shapes(), nodes.models)
    print(
        f"synthetic cluster: {nodes.n_nodes} nodes, {nodes.gpu_capacity_milli() // 1000} GPUs "
        f"(types drawn from {nodes_path.name}); trace {trace_path.name} inflated to 1.3x; seed {seeds[0]}",
        flush=True,
    )
    out: dict = {"nodes": nodes.n_nodes, "gpus": nodes.gpu_capacity_milli() // 1000, "seed": seeds[0], "policies": {}}
    for name in policies:
        run = replay(nodes, trace, get_policy(name), seeds[0], measure, profile, use_cache=not args.no_cache)
        s = summarise([run])
        out["policies"][name] = s
        print_row(name, s, header=len(out["policies"]) == 1)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.placement", description=__doc__.split("\n\n")[0])
    p.add_argument("--nodes", help="node list CSV (default: the trace's GPU node list)")
    p.add_argument(
        "--trace", help="pod list CSV, or default / gpushare40 / multigpu30, or a generated variant (gpuspec25, ...)"
    )
    p.add_argument(
        "--variants",
        choices=["train", "heldout", "all"],
        help="run the default trace and every generated variant of this split; compare the first two policies",
    )
    p.add_argument(
        "--policies", help="comma-separated (default: all; with --replay-time: first_fit,best_fit,fgd,portal)"
    )
    p.add_argument("--seeds", default="42-51", help="e.g. 42-51 or 42,43")
    p.add_argument("--json", help="write results here (default: /tmp/placement-<trace>.json)")
    p.add_argument("--synthetic-nodes", type=int, default=0, help="latency on a synthetic cluster of this many nodes")
    p.add_argument("--replay-time", action="store_true", help="replay creation/deletion times with queueing")
    p.add_argument("--orderings", default="fcfs,sjf,priority,fairshare", help="queue orderings for --replay-time")
    p.add_argument(
        "--speedup", type=float, default=30.0, help="--replay-time: divide arrival times by this (default 30)"
    )
    p.add_argument(
        "--replay-nodes", type=int, default=50, help="--replay-time: nodes drawn from the list (0 = all; default 50)"
    )
    p.add_argument("--no-cache", action="store_true", help="score every feasible node for every decision")
    p.add_argument("-v", "--verbose", action="store_true")
    args = p.parse_args(argv)

    if args.policies is None:
        from .placement_timereplay import DEFAULT_POLICIES

        args.policies = ",".join(DEFAULT_POLICIES if args.replay_time else POLICY_NAMES)
    policies = [x.strip() for x in args.policies.split(",") if x.strip()]
    for name in policies:
        get_policy(name)  # fail early on typos
    seeds = parse_seeds(args.seeds)
    trace_path = resolve_trace(args.trace)
    if args.replay_time:
        from .placement_timereplay import run_time_replay

        result = run_time_replay(args, policies, seeds)
        default_json = f"/tmp/placement-replay-time-{trace_key(trace_path)}.json"
    elif args.variants:
        result = run_variants(args, policies, seeds)
        default_json = f"/tmp/placement-variants-{args.variants}.json"
    elif args.synthetic_nodes:
        result = run_synthetic(args, policies, seeds)
        default_json = f"/tmp/placement-synthetic-{args.synthetic_nodes}.json"
    else:
        result = run_trace(args, policies, seeds)
        default_json = f"/tmp/placement-{trace_key(trace_path)}.json"
    target = Path(args.json or default_json)
    target.write_text(json.dumps(result, indent=2, sort_keys=False))
    print(f"wrote {target}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
