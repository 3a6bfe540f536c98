"""Where ``portal``'s decision time goes beside ``fgd``'s (issue 18, speed).

    python -m benchmarks.placement_portal_cost [--trace default] [--seeds 42-43]

Per seed, ``portal`` replays the trace (as :mod:`benchmarks.placement` does) while, for every
re-scoring, ``fgd`` scores the very same rows too (its result thrown away; the two go in
alternating order so neither always finds the rows in the CPU caches); then ``fgd`` replays
the trace on its own. Reported, in thread CPU time summed over the seeds:

* each policy's decision time and the ratio of decisions/s (portal / fgd), as in the benchmark;
* re-scorings and rows re-scored per policy (the score cache's misses: where a policy places
  decides how many rows each decision finds stale);
* ``portal``'s scoring (``evaluate`` + ``adjust``) against what ``fgd``'s scoring costs on
  the same rows, and the ratio ``portal`` would reach if its extra terms cost nothing: the
  rest of the gap comes from *where* it places, not from its arithmetic.

Timing wraps every call (about a microsecond each), so the absolute figures are a little
above the benchmark's; compare the ratios.
"""

from __future__ import annotations

import os

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import argparse  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402

from allocations.placement.fragmentation import ShapeTable  # noqa: E402
from allocations.placement.policies import get_policy  # noqa: E402
from allocations.placement.policies.base import Policy, PolicyContext  # noqa: E402

from .placement import load_trace_arg, parse_seeds, profile_of  # noqa: E402
from .placement_replay import replay  # noqa: E402
from .placement_trace import DEFAULT_NODES, load_nodes  # noqa: E402


#: Upper ends of the re-scoring size bins (rows).
SIZE_BINS = (1, 5, 20, 200, 10**9)


class _Timed:
    """Wraps a policy's ``evaluate`` and ``adjust``: CPU time, calls and rows; optionally also
    times a second policy's ``evaluate`` on the same rows."""

    def __init__(self, policy: Policy, shadow: Policy | None = None) -> None:
        self.policy, self.shadow = policy, shadow
        self.evaluate_s = self.adjust_s = self.shadow_s = 0.0
        self.calls = self.rows = 0
        #: Re-scorings by rows: 1, 2-5, 6-20, 21-200, more.
        self.sizes = [0] * len(SIZE_BINS)
        #: Re-scorings whose rows were all / some / none already scored at their version (any shape).
        self.seen_rows = {"all": 0, "some": 0, "none": 0}
        self._scored: dict[int, int] = {}
        evaluate, adjust = policy.evaluate, policy.adjust

        def timed_evaluate(arrays, demand, nodes, fit, ctx):
            shadow_first = self.calls % 2 == 1
            if self.shadow is not None and shadow_first:
                self._shadow(arrays, demand, nodes, fit, ctx)
            c = time.thread_time()
            out = evaluate(arrays, demand, nodes, fit, ctx)
            self.evaluate_s += time.thread_time() - c
            if self.shadow is not None and not shadow_first:
                self._shadow(arrays, demand, nodes, fit, ctx)
            self.calls += 1
            self.rows += len(nodes)
            self.sizes[sum(len(nodes) > top for top in SIZE_BINS[:-1])] += 1
            versions = arrays.version[nodes].tolist()
            seen = sum(self._scored.get(n) == v for n, v in zip(nodes.tolist(), versions))
            self.seen_rows["all" if seen == len(versions) else "some" if seen else "none"] += 1
            self._scored.update(zip(nodes.tolist(), versions))
            return out

        def timed_adjust(arrays, demand, nodes, scores, ctx):
            c = time.thread_time()
            out = adjust(arrays, demand, nodes, scores, ctx)
            self.adjust_s += time.thread_time() - c
            return out

        policy.evaluate, policy.adjust = timed_evaluate, timed_adjust

    def _shadow(self, arrays, demand, nodes, fit, ctx) -> None:
        c = time.thread_time()
        self.shadow.evaluate(arrays, demand, nodes, fit, ctx)
        self.shadow_s += time.thread_time() - c


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.placement_portal_cost", description=__doc__.split("\n\n")[0])
    p.add_argument("--trace", default="default", help="a shipped trace's name, a variant's name or a pod list CSV")
    p.add_argument("--seeds", default="42-43")
    args = p.parse_args(argv)
    nodes = load_nodes(DEFAULT_NODES)
    trace, _, source = load_trace_arg(args.trace)
    profile = profile_of(trace)
    measure = ShapeTable(trace.typical_shapes(), nodes.models)
    # The guard's one-off check (cached per profile and cluster) before anything is timed.
    get_policy("portal").prepare(nodes, PolicyContext(profile=profile))
    totals = {k: 0.0 for k in ("portal_s", "fgd_s", "p_eval", "p_adjust", "shadow", "f_eval", "f_adjust")}
    counts = {k: 0 for k in ("p_calls", "p_rows", "f_calls", "f_rows", "decisions")}
    sizes = {"portal": [0] * len(SIZE_BINS), "fgd": [0] * len(SIZE_BINS)}
    seen = {"portal": {"all": 0, "some": 0, "none": 0}, "fgd": {"all": 0, "some": 0, "none": 0}}
    for seed in parse_seeds(args.seeds):
        ours = _Timed(get_policy("portal"), shadow=get_policy("fgd"))
        run = replay(nodes, trace, ours.policy, seed, measure, profile)
        # The shadow's time fell inside portal's decisions: take it out again.
        totals["portal_s"] += float(run.cpu_s.sum()) - ours.shadow_s
        theirs = _Timed(get_policy("fgd"))
        base = replay(nodes, trace, theirs.policy, seed, measure, profile)
        totals["fgd_s"] += float(base.cpu_s.sum())
        totals["p_eval"] += ours.evaluate_s
        totals["p_adjust"] += ours.adjust_s
        totals["shadow"] += ours.shadow_s
        totals["f_eval"] += theirs.evaluate_s
        totals["f_adjust"] += theirs.adjust_s
        counts["p_calls"] += ours.calls
        counts["p_rows"] += ours.rows
        counts["f_calls"] += theirs.calls
        counts["f_rows"] += theirs.rows
        counts["decisions"] += len(run.cpu_s)
        for name, timed in (("portal", ours), ("fgd", theirs)):
            sizes[name] = [a + b for a, b in zip(sizes[name], timed.sizes)]
            for k, v in timed.seen_rows.items():
                seen[name][k] += v
        print(f"seed {seed}: portal {totals['portal_s']:.2f} s, fgd {totals['fgd_s']:.2f} s so far", flush=True)
    t, c = totals, counts
    free_terms = t["portal_s"] - t["p_eval"] - t["p_adjust"] + t["shadow"]
    print(f"trace {source}; {c['decisions']} decisions per policy; thread CPU seconds, seeds {args.seeds}")
    print(f"decision time: portal {t['portal_s']:.3f}, fgd {t['fgd_s']:.3f}; "
          f"decisions/s portal / fgd {t['fgd_s'] / t['portal_s']:.3f}")
    print(f"re-scorings: portal {c['p_calls']} ({c['p_rows']} rows), fgd {c['f_calls']} ({c['f_rows']} rows)")
    labels = ["1", "2-5", "6-20", "21-200", ">200"]
    for name in ("portal", "fgd"):
        print(f"  {name} re-scorings by rows: " + ", ".join(f"{lab}: {n}" for lab, n in zip(labels, sizes[name]))
              + f"; rows all / some / none already scored at their version: "
              + " / ".join(str(seen[name][k]) for k in ("all", "some", "none")))
    print(f"scoring: portal evaluate {t['p_eval']:.3f} + adjust {t['p_adjust']:.3f}; "
          f"fgd's evaluate on the same rows {t['shadow']:.3f}; fgd's own run {t['f_eval']:.3f}")
    print(f"portal / fgd decisions/s if portal's extra terms cost nothing: {t['fgd_s'] / free_terms:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
