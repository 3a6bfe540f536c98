"""Choose the ``portal`` policy's constants on the training variants; report on the held-out ones.

    python -m benchmarks.placement_sweep [--seeds 42-43] [--report-seeds 42-51] [--passes 1] [--json OUT]
    python -m benchmarks.placement_sweep --candidates '{"whole_weight": 0.2}' '{...}' [--seeds 42] [--json OUT]

Coordinate search: starting from the policy's current constants, each constant in turn is
tried at every value of its grid (the others held), and the best value is kept before
moving to the next constant. A candidate is judged on the default trace and every
*training* variant (:mod:`benchmarks.placement_variants`), against ``fgd`` in the same
run, by

    mean(ratio@100) + max(ratio@100) + sum of the points by which it is worse than fgd
    at 90% and 130% arrived (per variant, averaged)

(lower is better; ratio = portal / fgd unallocated GPU %). Every candidate's figures are
in the JSON. The chosen constants are then run on the *held-out* variants, which played
no part in choosing them, with more seeds. The search never sees the held-out variants.

``--candidates`` skips the search: it runs each given set of changes to the policy's
current constants (JSON objects; ``{}`` for the constants as they are) on the same training traces, judged the same way,
prints and records every one, and runs no held-out report (that is a separate, later step).
"""

from __future__ import annotations

import os

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import argparse  # noqa: E402
import functools  # noqa: E402
import json  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402

from allocations.placement.policies import get_policy  # noqa: E402
from allocations.placement.policies.portal import PortalPolicy  # noqa: E402

from .placement import compare_policies, parse_seeds, print_comparison  # noqa: E402
from .placement_trace import DEFAULT_NODES, DEFAULT_TRACE, load_nodes, load_trace  # noqa: E402
from .placement_variants import make_variant, variants  # noqa: E402

#: The values each constant may take (the hand-picked ones of before issue 18 included).
GRID: dict[str, tuple[float, ...]] = {
    "balance_weight": (3.0, 10.0, 30.0),
    "stranding_weight": (1.0, 2.0, 3.0),
    "remnant_weight": (1.5, 3.0, 4.5),
    "score_levels": (100, 200, 400),
    "filler_min_share": (0.02, 0.03, 0.05),
}


def objective(rows: dict[str, dict]) -> float:
    r100 = [r["ratio_at_100"] for r in rows.values()]
    worse = [max(0.0, r[f"portal_at_{p}"] - r[f"fgd_at_{p}"]) for r in rows.values() for p in (90, 130)]
    return float(np.mean(r100) + np.max(r100) + np.sum(worse) / len(rows))


def table_rows(results: dict[str, dict], split: dict[str, str]) -> dict[str, dict]:
    rows = {}
    for name, res in results.items():
        a, b = res["portal"], res["fgd"]
        row = {"split": split[name], "ratio_at_100": a["unallocated_pct_at_100"] / b["unallocated_pct_at_100"]}
        for p in (90, 100, 130):
            row[f"portal_at_{p}"] = a[f"unallocated_pct_at_{p}"]
            row[f"fgd_at_{p}"] = b[f"unallocated_pct_at_{p}"]
        rows[name] = row
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.placement_sweep", description=__doc__.split("\n\n")[0])
    p.add_argument("--seeds", default="42-43", help="seeds for the search on training variants")
    p.add_argument("--report-seeds", default="42-51", help="seeds for the held-out report")
    p.add_argument("--passes", type=int, default=1, help="coordinate-search passes over the constants")
    p.add_argument("--json", default="/tmp/placement-sweep.json")
    p.add_argument(
        "--candidates", nargs="+", metavar="JSON",
        help="only run these changes to the current constants on the training traces (no search, no held-out report)",
    )
    args = p.parse_args(argv)
    seeds, report_seeds = parse_seeds(args.seeds), parse_seeds(args.report_seeds)
    nodes = load_nodes(DEFAULT_NODES)
    base = load_trace(DEFAULT_TRACE)
    train = {"default": base} | {v.name: make_variant(v.name, base) for v in variants("train")}
    split = {"default": "-"} | {v.name: v.split for v in variants("all")}
    started = time.perf_counter()

    fgd_runs = {
        name: compare_policies(nodes, trace, {"fgd": functools.partial(get_policy, "fgd")}, seeds)["fgd"]
        for name, trace in train.items()
    }
    tried: list[dict] = []

    def evaluate(constants: dict) -> float:
        for t in tried:
            if t["constants"] == constants:
                return t["objective"]
        make = functools.partial(PortalPolicy, **constants)
        results = {
            name: {"portal": compare_policies(nodes, trace, {"portal": make}, seeds)["portal"], "fgd": fgd_runs[name]}
            for name, trace in train.items()
        }
        rows = table_rows(results, split)
        score = objective(rows)
        worst = max(rows, key=lambda k: rows[k]["ratio_at_100"])
        tried.append({"constants": dict(constants), "objective": score, "rows": rows})
        print(
            f"{score:7.4f}  worst {rows[worst]['ratio_at_100']:.3f} ({worst:10s}) default "
            f"{rows['default']['portal_at_100']:.2f}  {constants}  [{time.perf_counter() - started:.0f} s]",
            flush=True,
        )
        return score

    if args.candidates:
        current = PortalPolicy().constants()
        for text in args.candidates:
            evaluate(current | json.loads(text))
        out = {"search_seeds": seeds, "tried": tried, "wall_s": time.perf_counter() - started}
        Path(args.json).write_text(json.dumps(out, indent=2))
        print(f"wrote {args.json}", file=sys.stderr)
        return 0

    best = {k: getattr(PortalPolicy, k) for k in GRID}
    best_score = evaluate(best)
    for _ in range(args.passes):
        for key, values in GRID.items():
            for value in values:
                candidate = best | {key: value}
                score = evaluate(candidate)
                if score < best_score - 1e-9:
                    best, best_score = candidate, score
    print(f"chosen on training variants (seeds {args.seeds}): {best} objective {best_score:.4f}", flush=True)

    # Held-out report: the chosen constants against fgd, more seeds, variants never searched on.
    held = {v.name: make_variant(v.name, base) for v in variants("heldout")}
    makers = {"portal": functools.partial(PortalPolicy, **best), "fgd": functools.partial(get_policy, "fgd")}
    report = {
        name: {"split": "heldout", "policies": compare_policies(nodes, trace, makers, report_seeds)}
        for name, trace in held.items()
    }
    comparison = print_comparison(report, "portal", "fgd", report_seeds)
    out = {
        "grid": GRID,
        "search_seeds": seeds,
        "report_seeds": report_seeds,
        "chosen": best,
        "objective": best_score,
        "tried": tried,
        "heldout": comparison,
        "wall_s": time.perf_counter() - started,
    }
    Path(args.json).write_text(json.dumps(out, indent=2))
    print(f"wrote {args.json}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
