"""benchmarks.placement_speed_since: the base's replay timed in CPU, and the verdict from the two trees' ratios."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from benchmarks.placement_speed_since import DEFAULT_BASE, cpu_figures, summarise, time_decisions_in_cpu

ROOT = Path(__file__).resolve().parents[2]


def test_the_pre_18_replay_is_rewritten_to_time_each_decision_in_cpu_and_nothing_else() -> None:
    shown = subprocess.run(["git", "show", f"{DEFAULT_BASE}:benchmarks/placement_replay.py"], cwd=ROOT,
                           capture_output=True, text=True, check=False)
    if shown.returncode != 0:
        pytest.skip("the base commit is not in this clone (a shallow one)")
    before = shown.stdout
    after, rewritten = time_decisions_in_cpu(before)
    assert rewritten
    changed = [(a, b) for a, b in zip(before.splitlines(), after.splitlines(), strict=True) if a != b]
    assert [b.strip() for _, b in changed] == ["t0 = time.thread_time()", "latency[k] = time.thread_time() - t0"]


def test_a_replay_that_already_times_cpu_is_left_alone_and_an_unknown_one_refused() -> None:
    current = (ROOT / "benchmarks" / "placement_replay.py").read_text()
    assert time_decisions_in_cpu(current) == (current, False)
    with pytest.raises(ValueError):
        time_decisions_in_cpu("def replay():\n    pass\n")


def test_cpu_figures_come_from_the_cpu_columns_unless_the_latencies_are_cpu_already() -> None:
    row = {"placements_per_s": 100.0, "latency_ms_p99": 2.0, "cpu_placements_per_s": 120.0, "cpu_ms_p99": 1.5}
    assert cpu_figures({"policies": {"portal": row}}, "portal", rewritten=False) == (120.0, 1.5)
    assert cpu_figures({"policies": {"portal": row}}, "portal", rewritten=True) == (100.0, 2.0)
    old = {"placements_per_s": 90.0, "latency_ms_p99": 3.0}  # a base without CPU columns, its timer rewritten
    assert cpu_figures({"policies": {"fgd": old}}, "fgd", rewritten=True) == (90.0, 3.0)


def run(tree: str, portal_dps: float, fgd_dps: float, portal_p99: float, fgd_p99: float) -> dict:
    return {"tree": tree, "portal_dps": portal_dps, "fgd_dps": fgd_dps, "portal_p99_ms": portal_p99,
            "fgd_p99_ms": fgd_p99}


def test_within_15_percent_is_judged_on_each_trees_ratio_to_fgd() -> None:
    # The base runs on a slow spell and the tree now on a fast one: only the ratios count.
    runs = [run("base", 500, 1000, 2.0, 2.0), run("now", 900, 2000, 2.2, 2.0)]
    s = summarise(runs)
    assert s["decisions_ratio_now_over_base"] == pytest.approx(0.9)
    assert s["p99_ratio_now_over_base"] == pytest.approx(1.1)
    assert s["met"]
    assert not summarise([run("base", 500, 1000, 2.0, 2.0), run("now", 800, 2000, 1.0, 1.0)])["met"]  # 0.8
    assert not summarise([run("base", 500, 1000, 2.0, 2.0), run("now", 1000, 2000, 2.4, 2.0)])["met"]  # p99 1.2
    # Medians over the pairs: one loud run does not decide.
    noisy = [run("base", 500, 1000, 1, 1)] * 3 + [run("now", 500, 1000, 1, 1)] * 2 + [run("now", 100, 1000, 1, 1)]
    assert summarise(noisy)["met"]
