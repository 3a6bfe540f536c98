"""What a new workload profile costs the `portal` policy: `python -m benchmarks.profile_guard [--nodes N] [--json FILE]`.

A pool's profile (allocations.profiles.pool_profile) is one object per mix; the policies cache their
per-profile work on it (portal's guard check on a ~150-node copy of the cluster, its per-model terms), so the
first decision with a new object pays that work and the next ones do not. This times both on a pool of
`--nodes` eight-GPU nodes (four in five H100, the rest A100) for a few profiles that differ a little: the CPU
of the first decision with each new profile, beside a warm decision with the same profile in the same run
(the baseline). allocations.profiles.PROFILE_DRIFT is chosen against this cost.
"""
from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

from allocations.placement import ClusterState, NodeInfo, PlacementRequest, WorkloadProfile, place
from allocations.placement.state import GpuInfo


def pool(nodes: int) -> ClusterState:
    return ClusterState([NodeInfo(id=n, cpu_milli=128_000, memory_mib=1024 * 1024, gpus=tuple(
        GpuInfo(id=f"n{n}-g{k}", index=k, model="H100" if n % 5 else "A100", memory_mib=81_920) for k in range(8)))
        for n in range(nodes)])


def profile(pinned_pct: int) -> WorkloadProfile:
    """`pinned_pct` of 100 demands are 2 × H100-only, the rest one GPU of any model."""
    pinned = PlacementRequest(gpus=2, allowed_models=frozenset({"H100"}), cpu_milli=24_000, memory_mib=96 * 1024)
    anywhere = PlacementRequest(gpus=1, cpu_milli=12_000, memory_mib=48 * 1024)
    return WorkloadProfile.from_requests([pinned] * pinned_pct + [anywhere] * (100 - pinned_pct))


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=250)
    parser.add_argument("--profiles", type=int, default=5, help="new profiles timed (60 %%, 61 %%, ... pinned)")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    state = pool(args.nodes)
    request = PlacementRequest(gpus=1)
    first, warm = [], []
    for k in range(args.profiles):
        mix = profile(60 + k)
        began = time.process_time()
        place(state, request, "portal", profile=mix)
        first.append(1000 * (time.process_time() - began))
        began = time.process_time()
        place(state, request, "portal", profile=mix)
        warm.append(1000 * (time.process_time() - began))
    result = {"nodes": args.nodes, "gpus": 8 * args.nodes, "first_decision_cpu_ms": first, "warm_decision_cpu_ms": warm,
              "first_median_ms": statistics.median(first), "warm_median_ms": statistics.median(warm),
              "first_vs_warm": statistics.median(first) / max(statistics.median(warm), 1e-9)}
    print(f"portal on {args.nodes} nodes / {8 * args.nodes} GPUs, {args.profiles} new profiles (CPU ms)")
    print(f"{'decision':<28}{'median':>10}{'min':>10}{'max':>10}")
    for name, values in (("first with a new profile", first), ("warm (same profile)", warm)):
        print(f"{name:<28}{statistics.median(values):>10.1f}{min(values):>10.1f}{max(values):>10.1f}")
    print(f"first / warm: {result['first_vs_warm']:.0f}x")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    return result


if __name__ == "__main__":
    main()
