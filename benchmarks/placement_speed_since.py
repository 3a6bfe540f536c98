"""Decision speed now against an earlier commit's, each beside ``fgd`` in its own run (issue 18).

    python -m benchmarks.placement_speed_since [--base e0bb857^1] [--pairs 3] [--seeds 42-51] [--json OUT]

Issue 18 asks the ``portal`` policy's speed to stay "unchanged within 15% (decisions/s and p99
on the 1,213-node cluster, beside fgd in the same run)": the machine's speed drifts by 2x, so
each tree's ``portal`` is measured as a ratio to ``fgd`` timed in the same run, and the two
trees' ratios are compared. This checks the base commit (default: main just before issue 18
was merged) out into a temporary git worktree beside this one (so ``../shared`` is the same
data), runs ``python -m benchmarks.placement --trace default --policies portal,fgd`` there
and here alternately, ``--pairs`` times, and prints per run the CPU decisions/s and CPU p99 of
both policies and their ratios, then this tree's ratio over the base's (medians over the
pairs). Every decision is timed in thread CPU time in both trees: a base whose replay timed
wall-clock time (issue 18's base did) has that one timer rewritten in its worktree, nothing
else; the worktree is removed at the end.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
#: Main just before issue 18's merge (e0bb857: "Merge issue 18: the portal placement policy ...").
DEFAULT_BASE = "e0bb857^1"

#: The base's replay loop timing one decision in wall-clock time, and the same in thread CPU time.
_WALL_TIMER = re.compile(
    r"t0 = time\.perf_counter\(\)\n(\s+)choice = placer\.place\(demand\)\n"
    r"(\s+)latency\[k\] = time\.perf_counter\(\) - t0"
)
_CPU_TIMER = "t0 = time.thread_time()\n\\1choice = placer.place(demand)\n\\2latency[k] = time.thread_time() - t0"


def time_decisions_in_cpu(replay_source: str) -> tuple[str, bool]:
    """The base's ``placement_replay.py`` with each decision timed in thread CPU time, and whether it
    had to be rewritten (False: it already records CPU time per decision, ``cpu_s``)."""
    if "cpu_s" in replay_source and "thread_time" in replay_source:
        return replay_source, False
    rewritten, count = _WALL_TIMER.subn(_CPU_TIMER, replay_source)
    if count != 1:
        raise ValueError("the base's replay loop is not the one this script knows how to time in CPU")
    return rewritten, True


def cpu_figures(result: dict, policy: str, rewritten: bool) -> tuple[float, float]:
    """(CPU decisions/s, CPU p99 ms) of ``policy`` from ``benchmarks.placement``'s JSON. A rewritten
    base's latencies are CPU times already (its "placements_per_s" and "latency_ms_p99")."""
    row = result["policies"][policy]
    if rewritten or "cpu_placements_per_s" not in row:
        return row["placements_per_s"], row["latency_ms_p99"]
    return row["cpu_placements_per_s"], row["cpu_ms_p99"]


def run_once(tree: Path, seeds: str, out: Path) -> dict:
    subprocess.run(
        [sys.executable, "-m", "benchmarks.placement", "--trace", "default", "--policies", "portal,fgd",
         "--seeds", seeds, "--json", str(out)],
        cwd=tree, check=True, stdout=subprocess.DEVNULL,
    )
    return json.loads(out.read_text())


def load_average() -> float:
    try:
        return float(Path("/proc/loadavg").read_text().split()[0])
    except OSError:
        return float("nan")


def summarise(runs: list[dict]) -> dict:
    """Medians of each tree's portal / fgd ratios over its runs, and this tree's over the base's."""
    out: dict = {}
    for tree in ("base", "now"):
        mine = [r for r in runs if r["tree"] == tree]
        out[tree] = {
            "decisions_ratio": statistics.median(r["portal_dps"] / r["fgd_dps"] for r in mine),
            "p99_ratio": statistics.median(r["portal_p99_ms"] / r["fgd_p99_ms"] for r in mine),
        }
    out["decisions_ratio_now_over_base"] = out["now"]["decisions_ratio"] / out["base"]["decisions_ratio"]
    out["p99_ratio_now_over_base"] = out["now"]["p99_ratio"] / out["base"]["p99_ratio"]
    # "Unchanged within 15%": decisions/s no more than 15% lower, p99 no more than 15% higher, beside fgd.
    out["met"] = out["decisions_ratio_now_over_base"] >= 0.85 and out["p99_ratio_now_over_base"] <= 1.15
    return out


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(prog="python -m benchmarks.placement_speed_since", description=__doc__.split("\n\n")[0])
    p.add_argument("--base", default=DEFAULT_BASE, help="the commit to compare with (default: before issue 18)")
    p.add_argument("--pairs", type=int, default=3)
    p.add_argument("--seeds", default="42-51")
    p.add_argument("--json", type=Path, default=Path("/tmp/placement-speed-since.json"))
    args = p.parse_args(argv)
    sha = subprocess.run(["git", "rev-parse", args.base], cwd=REPO_ROOT, check=True, capture_output=True,
                         text=True).stdout.strip()
    # Beside this tree, so that the base's benchmarks find the same ../shared.
    worktree = REPO_ROOT.parent / f".speed-base-{sha[:10]}"
    subprocess.run(["git", "worktree", "add", "--detach", "--force", str(worktree), sha], cwd=REPO_ROOT, check=True,
                   capture_output=True)
    runs: list[dict] = []
    try:
        replay = worktree / "benchmarks" / "placement_replay.py"
        source, rewritten = time_decisions_in_cpu(replay.read_text())
        replay.write_text(source)
        with tempfile.TemporaryDirectory() as tmp:
            for k in range(args.pairs):
                for tree, path in (("base", worktree), ("now", REPO_ROOT)):
                    began, load = time.strftime("%H:%M:%S", time.gmtime()), load_average()
                    result = run_once(path, args.seeds, Path(tmp) / f"{tree}-{k}.json")
                    portal = cpu_figures(result, "portal", rewritten and tree == "base")
                    fgd = cpu_figures(result, "fgd", rewritten and tree == "base")
                    runs.append({"tree": tree, "pair": k + 1, "utc": began, "load": load,
                                 "portal_dps": portal[0], "portal_p99_ms": portal[1],
                                 "fgd_dps": fgd[0], "fgd_p99_ms": fgd[1],
                                 "portal_unallocated_at_100": result["policies"]["portal"]["unallocated_pct_at_100"]})
                    r = runs[-1]
                    print(f"pair {k + 1} {tree:4s} {began} UTC load {load:4.1f}: CPU decisions/s portal "
                          f"{r['portal_dps']:6.0f} fgd {r['fgd_dps']:6.0f} ({r['portal_dps'] / r['fgd_dps']:.3f}); "
                          f"CPU p99 portal {r['portal_p99_ms']:.3f} fgd {r['fgd_p99_ms']:.3f} ms "
                          f"({r['portal_p99_ms'] / r['fgd_p99_ms']:.3f})", flush=True)
    finally:
        subprocess.run(["git", "worktree", "remove", "--force", str(worktree)], cwd=REPO_ROOT, check=False,
                       capture_output=True)
    summary = summarise(runs)
    print(f"\nbase {args.base} ({sha[:10]}): portal / fgd decisions/s {summary['base']['decisions_ratio']:.3f}, "
          f"p99 {summary['base']['p99_ratio']:.3f}; now: {summary['now']['decisions_ratio']:.3f}, "
          f"p99 {summary['now']['p99_ratio']:.3f} (medians over {args.pairs} pairs)")
    print(f"now over base: decisions/s ratio x{summary['decisions_ratio_now_over_base']:.3f} (within 15%: >= 0.85), "
          f"p99 ratio x{summary['p99_ratio_now_over_base']:.3f} (within 15%: <= 1.15): "
          f"{'met' if summary['met'] else 'NOT met'}")
    out = {"base": args.base, "base_sha": sha, "seeds": args.seeds, "runs": runs, "summary": summary}
    args.json.write_text(json.dumps(out, indent=2))
    print(f"wrote {args.json}")
    return out


if __name__ == "__main__":
    main()
