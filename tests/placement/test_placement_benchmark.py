"""The benchmark harness on tiny hand-written traces (the real runs are benchmarks, not tests)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from benchmarks.placement import main, parse_seeds
from benchmarks.placement_replay import RunResult
from benchmarks.placement_trace import inflated_order, load_nodes, load_trace

NODES = """sn,cpu_milli,memory_mib,gpu,model
node-0,32000,131072,4,G2
node-1,32000,131072,4,G2
node-2,64000,262144,2,T4
"""

PODS = """name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,deletion_time,scheduled_time
p0,4000,8192,1,1000,,LS,Running,0,100,0
p1,2000,4096,1,500,,BE,Running,10,50,10
p2,2000,4096,1,500,,BE,Running,20,200,20
p3,8000,16384,2,1000,,LS,Running,30,300,30
p4,1000,2048,0,0,,Burstable,Running,40,90,40
p5,4000,8192,1,300,T4,LS,Running,50,400,50
p6,16000,32768,4,1000,,Guaranteed,Running,60,500,60
"""


@pytest.fixture
def tiny(tmp_path: Path) -> tuple[Path, Path]:
    nodes, pods = tmp_path / "nodes.csv", tmp_path / "pods.csv"
    nodes.write_text(NODES)
    pods.write_text(PODS)
    return nodes, pods


def test_parse_seeds() -> None:
    assert parse_seeds("42-45") == [42, 43, 44, 45]
    assert parse_seeds("1,3,5-6") == [1, 3, 5, 6]


def test_loading_the_trace(tiny: tuple[Path, Path]) -> None:
    nodes_path, pods_path = tiny
    nodes, trace = load_nodes(nodes_path), load_trace(pods_path)
    assert nodes.n_nodes == 3 and nodes.gpu_capacity_milli() == 10_000
    assert list(trace.gpu_request) == [1000, 500, 500, 2000, 0, 300, 4000]
    assert trace.demand(5).allowed_models == frozenset({"T4"})
    assert trace.creation is not None and trace.creation[3] == 30


def test_inflation_stops_at_the_first_draw_that_would_exceed_the_target(tiny: tuple[Path, Path]) -> None:
    _, pods_path = tiny
    trace = load_trace(pods_path)
    request = trace.gpu_request
    for seed in range(20):
        order = inflated_order(trace, 10_000, np.random.default_rng(seed))
        total = int(request[order].sum())
        assert sorted(order[: len(trace)]) == list(range(len(trace)))  # the whole trace, shuffled, first
        assert total <= 13_000
        # Replay the generator: after the appended draws, the next one must overshoot.
        rng = np.random.default_rng(seed)
        rng.permutation(len(trace))
        for j in order[len(trace) :]:
            assert int(rng.integers(len(trace))) == j
        assert total + int(request[int(rng.integers(len(trace)))]) > 13_000


def test_headline_metric_averages_the_rounded_bin() -> None:
    r = RunResult(
        policy="x",
        seed=0,
        arrived_pct=np.array([98.0, 99.4, 99.6, 100.4, 100.6]),
        allocated_pct=np.array([98.0, 99.0, 96.0, 94.0, 94.0]),
        frag_pct=np.zeros(5),
        latency_s=np.zeros(5),
        cpu_s=np.zeros(5),
        prepare_s=0.0,
        placed=5,
        failed=0,
        wall_s=0.0,
    )
    assert r.unallocated_at(100) == pytest.approx(100 - (96.0 + 94.0) / 2)
    assert np.isnan(r.at(r.allocated_pct, 120))


def test_cli_runs_every_policy_and_writes_json(tiny: tuple[Path, Path], tmp_path: Path) -> None:
    nodes_path, pods_path = tiny
    out = tmp_path / "out.json"
    assert main(["--nodes", str(nodes_path), "--trace", str(pods_path), "--seeds", "1-2", "--json", str(out)]) == 0
    data = json.loads(out.read_text())
    assert data["seeds"] == [1, 2]
    assert set(data["policies"]) == {
        "random",
        "first_fit",
        "best_fit",
        "spread",
        "packing",
        "dot_product",
        "clustering",
        "fgd",
        "portal",
    }
    for summary in data["policies"].values():
        for key in (
            "unallocated_pct_at_100",
            "unallocated_pct_at_130",
            "frag_pct_at_90",
            "placements_per_s",
            "latency_ms_p50",
            "latency_ms_p99",
        ):
            assert key in summary
        assert summary["placements_per_s"] > 0


def test_cli_time_replay(tiny: tuple[Path, Path], tmp_path: Path) -> None:
    nodes_path, pods_path = tiny
    out = tmp_path / "replay.json"
    rc = main(
        [
            "--nodes",
            str(nodes_path),
            "--trace",
            str(pods_path),
            "--replay-time",
            "--policies",
            "best_fit,portal",
            "--orderings",
            "fcfs,sjf,priority,fairshare",
            "--speedup",
            "1",
            "--replay-nodes",
            "0",
            "--json",
            str(out),
        ]
    )
    assert rc == 0
    data = json.loads(out.read_text())
    for policy in ("best_fit", "portal"):
        runs = data["results"][policy]
        assert set(runs) == {"fcfs", "fcfs+backfill", "sjf+backfill", "priority+backfill", "fairshare+backfill"}
        for r in runs.values():
            assert r["started"] + r["rejected_never_fit"] + r["never_started"] == r["tasks"] == 7
            assert r["mean_delay_s"] >= 0


def test_cli_synthetic_cluster(tiny: tuple[Path, Path], tmp_path: Path) -> None:
    nodes_path, pods_path = tiny
    out = tmp_path / "syn.json"
    assert (
        main(
            [
                "--nodes",
                str(nodes_path),
                "--trace",
                str(pods_path),
                "--synthetic-nodes",
                "30",
                "--policies",
                "portal",
                "--seeds",
                "3",
                "--json",
                str(out),
            ]
        )
        == 0
    )
    data = json.loads(out.read_text())
    assert data["nodes"] == 30 and data["policies"]["portal"]["placements_per_s"] > 0


def test_decision_recordings_compare_every_bit_of_the_score(tmp_path: Path) -> None:
    from allocations.placement.engine import Choice
    from benchmarks.placement_decisions import SLOTS, compare, decision_row

    placed = Choice(node=3, slots=(1, 2), mig_start=None, score=97.0, candidates=10)
    row = decision_row(placed)
    assert row[:2] == [3, -1] and row[3:6] == [1, 2, -1] and len(row) == 3 + SLOTS
    assert decision_row(None) == [-1] * (3 + SLOTS)
    nudged = Choice(node=3, slots=(1, 2), mig_start=None, score=float(np.nextafter(97.0, 0.0)), candidates=10)
    a, b, c = tmp_path / "a.npz", tmp_path / "b.npz", tmp_path / "c.npz"
    np.savez(a, run=np.array([row, decision_row(None)]))
    np.savez(b, run=np.array([row, decision_row(None)]))
    np.savez(c, run=np.array([decision_row(nudged), decision_row(None)]))
    assert compare(str(a), str(b)) == 0
    assert compare(str(a), str(c)) == 1  # one ulp of score is a different decision record
