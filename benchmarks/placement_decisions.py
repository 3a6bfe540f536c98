"""Record every decision of a policy on traces and seeds, and compare two recordings bit for bit.

    python -m benchmarks.placement_decisions record OUT.npz [--policy portal] default:42-51 gpuspec50:42 ...
    python -m benchmarks.placement_decisions compare BEFORE.npz AFTER.npz

For a change that must not move a single decision (a faster path, a refactor): record with
the code before and after and compare. Per run (trace and seed, replayed as
:mod:`benchmarks.placement` does) it keeps, for every arriving task, the chosen node, its
GPU slots, the MIG start and the score's exact bits (-1s and no score for a dropped task).
"""

from __future__ import annotations

import argparse
import sys

import numpy as np

from allocations.placement.engine import Choice
from allocations.placement.fragmentation import ShapeTable
from allocations.placement.policies import get_policy

from .placement import load_trace_arg, parse_seeds, profile_of
from .placement_replay import replay
from .placement_trace import DEFAULT_NODES, load_nodes

#: GPU slots kept per decision (more than any node of the shipped clusters has).
SLOTS = 16


def decision_row(choice: Choice | None) -> list[int]:
    """One decision as integers: node, MIG start, the score's bits, GPU slots (-1 padded)."""
    if choice is None:
        return [-1] * (3 + SLOTS)
    bits = int(np.float64(choice.score).view(np.int64))
    start = -1 if choice.mig_start is None else choice.mig_start
    return [choice.node, start, bits, *choice.slots, *([-1] * (SLOTS - len(choice.slots)))]


def record(out: str, policy: str, runs: list[str]) -> int:
    nodes = load_nodes(DEFAULT_NODES)
    recorded: dict[str, np.ndarray] = {}
    for spec in runs:
        name, seeds = spec.split(":", 1)
        trace, _, _ = load_trace_arg(name)
        profile = profile_of(trace)
        measure = ShapeTable(trace.typical_shapes(), nodes.models)
        for seed in parse_seeds(seeds):
            log: list[list[int]] = []
            run = replay(
                nodes, trace, get_policy(policy), seed, measure, profile,
                on_choice=lambda c, log=log: log.append(decision_row(c)),
            )
            recorded[f"{name}_{seed}"] = np.array(log, dtype=np.int64)
            unallocated = run.unallocated_at(100)
            print(f"{name} seed {seed}: {len(log)} decisions, unallocated at 100% {unallocated:.4f}", flush=True)
    np.savez_compressed(out, **recorded)
    print(f"wrote {out}")
    return 0


def compare(before: str, after: str) -> int:
    a, b = np.load(before), np.load(after)
    common = sorted(set(a.files) & set(b.files))
    differ = [k for k in common if not np.array_equal(a[k], b[k])]
    for k in differ:
        first = int(np.flatnonzero((a[k] != b[k]).any(axis=1))[0]) if a[k].shape == b[k].shape else 0
        print(f"{k}: differs (first at decision {first})")
    only = sorted(set(a.files) ^ set(b.files))
    print(f"{len(common)} runs compared, {len(differ)} differ" + (f"; only in one file: {only}" if only else ""))
    return 1 if differ else 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.placement_decisions", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="command", required=True)
    r = sub.add_parser("record")
    r.add_argument("out")
    r.add_argument("runs", nargs="+", help="TRACE:SEEDS, e.g. default:42-51 gpuspec50:42")
    r.add_argument("--policy", default="portal")
    c = sub.add_parser("compare")
    c.add_argument("before")
    c.add_argument("after")
    args = p.parse_args(argv)
    if args.command == "record":
        return record(args.out, args.policy, args.runs)
    return compare(args.before, args.after)


if __name__ == "__main__":
    sys.exit(main())
