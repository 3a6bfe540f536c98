"""What a policy's ``evaluate`` and ``adjust`` cost per decision, by demand kind (issue 18, speed).

    python -m benchmarks.placement_adjust_cost [--policy portal] [--trace default] [--seed 42]

Replays one seed as :mod:`benchmarks.placement` does and times, in thread CPU, every call of
the policy's ``evaluate`` (the score cache's re-scorings) and ``adjust`` (the cluster-wide
correction, run every decision), per decision. Prints the decisions' total CPU time, the
share of ``evaluate`` and ``adjust`` in it, ``adjust``'s mean per decision for each demand
kind, and what the slowest 1% of decisions are made of. Timing wraps every call (about a
microsecond each); compare runs of the same command, old and new code taken alternately.
"""

from __future__ import annotations

import os

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import argparse  # noqa: E402
import collections  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402

import numpy as np  # noqa: E402

from allocations.placement.fragmentation import ShapeTable  # noqa: E402
from allocations.placement.policies import get_policy  # noqa: E402

from .placement import load_trace_arg, profile_of  # noqa: E402
from .placement_replay import replay  # noqa: E402
from .placement_trace import DEFAULT_NODES, load_nodes  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.placement_adjust_cost", description=__doc__.split("\n\n")[0])
    p.add_argument("--policy", default="portal")
    p.add_argument("--trace", default="default", help="a shipped trace's name, a variant's name or a pod list CSV")
    p.add_argument("--seed", type=int, default=42)
    args = p.parse_args(argv)
    nodes = load_nodes(DEFAULT_NODES)
    trace, _, source = load_trace_arg(args.trace)
    profile = profile_of(trace)
    measure = ShapeTable(trace.typical_shapes(), nodes.models)
    policy = get_policy(args.policy)
    evaluate, adjust = policy.evaluate, policy.adjust
    cur = {"evaluate": 0.0, "adjust": 0.0, "rows": 0, "kind": "-"}
    per_decision: list[tuple[float, float, int, str]] = []

    def timed_evaluate(arrays, demand, nodes, fit, ctx):
        t = time.thread_time()
        out = evaluate(arrays, demand, nodes, fit, ctx)
        cur["evaluate"] += time.thread_time() - t
        cur["rows"] += len(nodes)
        return out

    def timed_adjust(arrays, demand, nodes, scores, ctx):
        cur["kind"] = demand.kind.name
        t = time.thread_time()
        out = adjust(arrays, demand, nodes, scores, ctx)
        cur["adjust"] += time.thread_time() - t
        return out

    def after_decision(choice) -> None:  # untimed, in decision order (as the run's cpu_s)
        per_decision.append((cur["evaluate"], cur["adjust"], cur["rows"], cur["kind"]))
        cur.update(evaluate=0.0, adjust=0.0, rows=0, kind="-")

    policy.evaluate, policy.adjust = timed_evaluate, timed_adjust
    run = replay(nodes, trace, policy, args.seed, measure, profile, on_choice=after_decision)
    total = run.cpu_s
    ev = np.array([r[0] for r in per_decision])
    ad = np.array([r[1] for r in per_decision])
    print(f"{args.policy} on {source}, seed {args.seed}: {len(total)} decisions, thread CPU")
    print(f"decisions {total.sum():.3f} s (mean {total.mean() * 1e6:.0f} µs, p99 {np.percentile(total, 99) * 1e3:.3f} ms); "
          f"evaluate {ev.sum():.3f} s, adjust {ad.sum():.3f} s")
    for kind in ("FRACTION", "WHOLE", "CPU_ONLY", "MIG"):
        sel = [i for i, r in enumerate(per_decision) if r[3] == kind]
        if sel:
            print(f"  {kind:9s} {len(sel):6d} decisions: adjust mean {ad[sel].mean() * 1e6:6.1f} µs, "
                  f"decision mean {total[sel].mean() * 1e6:6.1f} µs")
    top = np.argsort(total)[-max(1, len(total) // 100):]
    kinds = collections.Counter(per_decision[i][3] for i in top)
    print(f"slowest 1%: decision {total[top].mean() * 1e3:.2f} ms, evaluate {ev[top].mean() * 1e3:.2f}, "
          f"adjust {ad[top].mean() * 1e3:.2f}, rows re-scored {np.mean([per_decision[i][2] for i in top]):.0f}, "
          + ", ".join(f"{k} {n}" for k, n in kinds.most_common()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
