"""The portal-facing API: time windows, constraints, and the reasons users see."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from allocations.placement import (
    ClusterState,
    Holding,
    InvalidRequest,
    InvalidState,
    Placement,
    PlacementRequest,
    Unplaceable,
    earliest_start,
    explain,
    place,
    place_many,
)

from .conftest import make_node

H = 3600.0


def req(**kw) -> PlacementRequest:
    kw.setdefault("start", 0.0)
    kw.setdefault("end", H)
    return PlacementRequest(**kw)


def busy(node: str, gpu: int, start: float = 0.0, end: float = H, milli: int = 1000, **kw) -> Holding:
    return Holding(node, start, end, gpu_id=f"{node}-g{gpu}", milli=milli, **kw)


def test_whole_gpus_land_on_one_node(small_state: ClusterState) -> None:
    d = place(small_state, req(gpus=4))
    assert isinstance(d, Placement)
    assert len(d.gpus) == 4 and len({g.gpu_id.split("-")[0] for g in d.gpus}) == 1
    assert {g.milli for g in d.gpus} == {1000}


def test_holdings_outside_the_window_do_not_block(small_state: ClusterState) -> None:
    later = [busy(n, g, 2 * H, 3 * H) for n in ("n0", "n1", "n2") for g in range(4)]
    state = small_state.with_holdings(later)
    assert place(state, req(gpus=4)).ok
    assert place(state, req(gpus=1, start=1.5 * H, end=2.5 * H)).code == "insufficient_capacity"


def test_future_reservation_blocks_only_overlapping_windows(small_state: ClusterState) -> None:
    state = small_state.with_holdings([busy("n0", g, 5 * H, 6 * H) for g in range(4)])
    d = place(state, req(gpus=4, start=4 * H, end=5.5 * H, node_labels={"zone": "a"}))
    assert d.ok and d.node_id == "n1"
    d = place(state, req(gpus=4, start=4 * H, end=5 * H, node_labels={"zone": "a"}))
    assert d.ok and d.node_id == "n0"  # ends exactly when the reservation starts


def test_fraction_shares_a_gpu_up_to_1000_milli(small_state: ClusterState) -> None:
    state = small_state.with_holdings([busy("n0", 0, milli=700)])
    d = place(state, req(milli=300, node_labels={"zone": "a"}), policy="best_fit")
    assert d.ok and d.gpus[0].gpu_id == "n0-g0" and d.gpus[0].milli == 300
    state = state.with_holdings(d.holdings())
    d = place(state, req(milli=301, node_labels={"zone": "a"}), policy="best_fit")
    assert d.ok and d.gpus[0].gpu_id != "n0-g0"


def test_fraction_respects_gpu_memory() -> None:
    state = ClusterState([make_node("n0", 1, gpu_mem=40_000)], [busy("n0", 0, milli=200, gpu_memory_mib=30_000)])
    assert place(state, req(milli=200, gpu_memory_mib=10_000)).ok
    d = place(state, req(milli=200, gpu_memory_mib=10_001))
    assert d.code == "fragmented" and "memory" in d.message


def test_min_gpu_memory_and_models_are_honoured() -> None:
    state = ClusterState([make_node("small", 2, model="T4", gpu_mem=16_384), make_node("big", 2, gpu_mem=81_920)])
    assert place(state, req(gpus=1, min_gpu_memory_mib=20_000)).node_id == "big"
    assert place(state, req(gpus=1, allowed_models={"T4"})).node_id == "small"
    d = place(state, req(gpus=1, allowed_models={"T4"}, min_gpu_memory_mib=20_000))
    assert d.code == "no_gpu_model"


def test_labels_and_health(small_state: ClusterState) -> None:
    assert place(small_state, req(gpus=1, node_labels={"zone": "b"})).node_id == "n2"
    assert place(small_state, req(gpus=1, node_labels={"zone": "c"})).code == "no_matching_nodes"
    sick = ClusterState([make_node("n0", 2, healthy=False), make_node("n1", 2)])
    assert place(sick, req(gpus=2)).node_id == "n1"


def test_fragmented_reason_counts_free_gpus(small_state: ClusterState) -> None:
    state = small_state.with_holdings(
        [
            busy("n0", 0),
            busy("n0", 1),
            busy("n0", 2),
            busy("n1", 0),
            busy("n1", 1),
            busy("n2", 0),
            busy("n2", 1),
            busy("n2", 2),
        ]
    )
    d = place(state, req(gpus=4))
    assert isinstance(d, Unplaceable)
    assert d.code == "fragmented"
    assert d.message == "4 GPUs are free in total but no node has 4 free (the most on one node is 2)."
    assert d.reasons[0].details == {"requested": 4, "free": 4, "most_on_one_node": 2}


def test_insufficient_and_too_large(small_state: ClusterState) -> None:
    state = small_state.with_holdings([busy(n, g) for n in ("n0", "n1", "n2") for g in range(3)])
    assert place(state, req(gpus=4)).code == "insufficient_capacity"
    assert place(small_state, req(gpus=8)).code == "too_large"


def test_cpu_and_memory_go_with_the_gpus() -> None:
    state = ClusterState([make_node("n0", 4, cpu=16_000, mem=64 * 1024)])
    assert place(state, req(gpus=1, cpu_milli=16_000, memory_mib=64 * 1024)).ok
    d = place(state, req(gpus=1, cpu_milli=16_001))
    assert d.code == "cpu_memory" and "16 cores" in d.message
    state = state.with_holdings([Holding("n0", 0, H, cpu_milli=10_000)])
    assert place(state, req(cpu_milli=6_000)).ok  # CPU-only work
    assert place(state, req(cpu_milli=6_001)).code == "cpu_memory"


def test_over_quota() -> None:
    state = ClusterState([make_node("n0", 4)])
    d = place(state, req(gpus=2, quota_gpus_remaining=1.5))
    assert d.code == "over_quota" and "1.5" in d.message
    assert place(state, req(milli=500, quota_gpus_remaining=0.5)).ok
    assert place(state, req(mig_profile="3g.40gb", quota_gpus_remaining=0.4)).code == "over_quota"


def test_mig_reasons_and_geometry() -> None:
    state = ClusterState([make_node("n0", 1, mig=True), make_node("t4", 1, model="T4", gpu_mem=16_384)])
    assert place(state, req(mig_profile="3g.20gb")).code == "no_mig_profile"  # that is an A100-40GB profile
    assert place(state, req(mig_profile="9g.1tb")).code == "invalid_request"
    first = place(state, req(mig_profile="4g.40gb"))
    assert first.ok and first.gpus[0].mig_start == 0
    state = state.with_holdings(first.holdings())
    second = place(state, req(mig_profile="3g.40gb"))
    assert second.ok and second.gpus[0].mig_start == 4
    state = state.with_holdings(second.holdings())
    d = place(state, req(mig_profile="1g.10gb"))
    assert d.code == "insufficient_capacity"
    # Free slices 0 and 2 exist but not two adjacent from an even start: fragmented.
    odd = ClusterState(
        [make_node("n0", 1, mig=True)],
        [Holding("n0", 0, H, gpu_id="n0-g0", mig_profile="1g.10gb", mig_start=s) for s in (1, 3, 4, 5, 6)],
    )
    d = place(odd, req(mig_profile="2g.20gb"))
    assert d.code == "mig_fragmented" and "0 or 2 or 4" in d.message


def test_mig_and_milli_sharing_never_mix_on_one_gpu() -> None:
    state = ClusterState([make_node("n0", 1, mig=True)], [busy("n0", 0, milli=100)])
    d = place(state, req(mig_profile="1g.10gb"))
    assert d.code == "insufficient_capacity" and "whole or shared" in d.message
    state = ClusterState(
        [make_node("n0", 1, mig=True)], [Holding("n0", 0, H, gpu_id="n0-g0", mig_profile="1g.10gb", mig_start=6)]
    )
    assert place(state, req(milli=100)).code == "insufficient_capacity"  # a MIG-mode GPU has no milli to share
    assert place(state, req(gpus=1)).code == "insufficient_capacity"


def test_datetimes_work_as_window_bounds(small_state: ClusterState) -> None:
    t0 = datetime(2025, 3, 1, tzinfo=UTC)
    state = small_state.with_holdings(
        [Holding("n0", t0, t0 + timedelta(hours=2), gpu_id=f"n0-g{g}", milli=1000) for g in range(4)]
    )
    d = place(
        state,
        PlacementRequest(gpus=4, start=t0 + timedelta(hours=1), end=t0 + timedelta(hours=3), node_labels={"zone": "a"}),
    )
    assert d.ok and d.node_id == "n1"
    assert d.start == (t0 + timedelta(hours=1)).timestamp()


def test_place_many_sees_earlier_placements(small_state: ClusterState) -> None:
    decisions, after = place_many(small_state, [req(gpus=4)] * 4)
    assert [d.ok for d in decisions] == [True, True, True, False]
    assert len({d.node_id for d in decisions[:3]}) == 3
    assert len(after.holdings) == 12


def test_earliest_start_waits_for_the_next_release(small_state: ClusterState) -> None:
    state = small_state.with_holdings([busy(n, 0, 0, (k + 1) * H) for k, n in enumerate(["n0", "n1", "n2"])])
    d = earliest_start(state, req(gpus=4))
    assert d is not None and d.start == H and d.end == 2 * H and d.node_id == "n0"
    assert earliest_start(state, req(gpus=5)) is None  # too large: waiting will not help


def test_explain_lists_reasons_without_placing(small_state: ClusterState) -> None:
    assert explain(small_state, req(gpus=4)) == []
    assert [r.code for r in explain(small_state, req(gpus=16))] == ["too_large"]


def test_invalid_requests_and_states(small_state: ClusterState) -> None:
    with pytest.raises(InvalidRequest):
        PlacementRequest(gpus=1, milli=500)
    with pytest.raises(InvalidRequest):
        PlacementRequest(milli=1000)
    with pytest.raises(InvalidRequest):
        PlacementRequest(gpus=1, start=5, end=5)
    with pytest.raises(InvalidState):
        place(small_state.with_holdings([Holding("n0", 0, H, gpu_id="nope", milli=10)]), req(gpus=1))
    with pytest.raises(InvalidState):
        place(
            small_state.with_holdings([Holding("n0", 0, H, gpu_id="n0-g0", mig_profile="3g.40gb", mig_start=2)]),
            req(gpus=1),
        )
    with pytest.raises(InvalidState):
        place(small_state.with_holdings([Holding("n1", 0, H, gpu_id="n0-g0", milli=10)]), req(gpus=1))


def test_ties_go_to_the_first_listed_node(small_state: ClusterState) -> None:
    for policy in ("first_fit", "best_fit", "fgd", "portal", "packing"):
        assert place(small_state, req(gpus=1), policy=policy).node_id == "n0"
