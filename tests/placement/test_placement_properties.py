"""Property tests: whatever the cluster, requests and policy, placements never break the rules."""

from __future__ import annotations

from collections import defaultdict

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from allocations.placement import (
    POLICY_NAMES,
    ClusterState,
    GpuInfo,
    Holding,
    NodeInfo,
    Placement,
    PlacementRequest,
    place,
)
from allocations.placement.engine import Placer
from allocations.placement.mig import profile_for
from allocations.placement.policies import get_policy
from allocations.placement.policies.base import PolicyContext
from allocations.placement.workload import demand_for

H = 3600.0
MODELS = {"A100-SXM4-80GB": (81_920, True), "H100-80GB": (81_920, True), "T4": (16_384, False)}
MIG_PROFILES = ["1g.10gb", "1g.10gb+me", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb"]


@st.composite
def clusters(draw) -> ClusterState:
    nodes = []
    for i in range(draw(st.integers(1, 4))):
        model = draw(st.sampled_from(sorted(MODELS)))
        mem, mig = MODELS[model]
        n = draw(st.integers(1, 4))
        gpus = tuple(
            GpuInfo(
                id=f"n{i}g{j}",
                index=j,
                model=model,
                memory_mib=mem,
                mig_capable=mig,
                healthy=draw(st.booleans()) or j > 0,
            )
            for j in range(n)
        )
        nodes.append(
            NodeInfo(
                id=f"n{i}",
                cpu_milli=draw(st.sampled_from([8_000, 16_000, 32_000])),
                memory_mib=draw(st.sampled_from([32_768, 65_536])),
                gpus=gpus,
                labels={"zone": draw(st.sampled_from(["a", "b"]))},
                healthy=draw(st.integers(0, 9)) > 0,
            )
        )
    return ClusterState(nodes)


@st.composite
def requests(draw) -> PlacementRequest:
    kind = draw(st.sampled_from(["whole", "fraction", "mig", "cpu"]))
    start = draw(st.integers(0, 5)) * H
    kw: dict = dict(
        cpu_milli=draw(st.integers(0, 8)) * 1_000,
        memory_mib=draw(st.integers(0, 4)) * 4_096,
        start=start,
        end=start + draw(st.integers(1, 3)) * H,
        allowed_models=draw(
            st.sampled_from([frozenset(), frozenset({"T4"}), frozenset({"A100-SXM4-80GB", "H100-80GB"})])
        ),
        min_gpu_memory_mib=draw(st.sampled_from([0, 0, 20_000])),
        node_labels=draw(st.sampled_from([{}, {}, {"zone": "a"}])),
    )
    if kind == "whole":
        kw["gpus"] = draw(st.sampled_from([1, 1, 2, 4]))
    elif kind == "fraction":
        kw["milli"] = draw(st.integers(1, 999))
        kw["gpu_memory_mib"] = draw(st.sampled_from([0, 4_096, 12_000]))
    elif kind == "mig":
        kw["mig_profile"] = draw(st.sampled_from(MIG_PROFILES))
    return PlacementRequest(**kw)


def check_invariants(state: ClusterState) -> None:
    """Capacity is never exceeded at any instant, MIG slices never overlap and start legally."""
    gpus = {g.id: (n, g) for n in state.nodes for g in n.gpus}
    nodes = {n.id: n for n in state.nodes}
    times = sorted({h.window[0] for h in state.holdings})
    for t in times:
        live = [h for h in state.holdings if h.window[0] <= t < h.window[1]]
        cpu, mem = defaultdict(int), defaultdict(int)
        milli, gmem, mig_mask, media = defaultdict(int), defaultdict(int), defaultdict(int), defaultdict(int)
        for h in live:
            cpu[h.node_id] += h.cpu_milli
            mem[h.node_id] += h.memory_mib
            if h.gpu_id is None:
                continue
            node, gpu = gpus[h.gpu_id]
            assert node.id == h.node_id
            if h.mig_profile is not None:
                p = profile_for(gpu.model, h.mig_profile)
                assert p is not None and gpu.mig_capable and h.mig_start in p.starts
                assert mig_mask[h.gpu_id] & p.mask(h.mig_start) == 0, "MIG instances overlap"
                mig_mask[h.gpu_id] |= p.mask(h.mig_start)
                media[h.gpu_id] += p.single_per_gpu
            else:
                milli[h.gpu_id] += h.milli
                gmem[h.gpu_id] += h.gpu_memory_mib
        for gid in set(milli) | set(mig_mask):
            assert not (milli[gid] and mig_mask[gid]), "MIG and milli sharing on one GPU at once"
            assert milli[gid] <= 1000
            assert gmem[gid] <= gpus[gid][1].memory_mib
            assert media[gid] <= 1
        for nid in cpu:
            assert cpu[nid] <= nodes[nid].cpu_milli and mem[nid] <= nodes[nid].memory_mib


def check_placement(state: ClusterState, request: PlacementRequest, d: Placement) -> None:
    node = next(n for n in state.nodes if n.id == d.node_id)
    assert node.healthy and node.schedulable
    assert all(node.labels.get(k) == v for k, v in request.node_labels.items())
    by_id = {g.id: g for g in node.gpus}
    assert all(a.gpu_id in by_id for a in d.gpus), "every GPU of a placement is on its node"
    assert len({a.gpu_id for a in d.gpus}) == len(d.gpus)
    for a in d.gpus:
        gpu = by_id[a.gpu_id]
        assert gpu.healthy
        assert not request.allowed_models or gpu.model in request.allowed_models
        assert gpu.memory_mib >= request.min_gpu_memory_mib
    if request.gpus:
        assert len(d.gpus) == request.gpus and all(a.milli == 1000 for a in d.gpus)
    elif request.milli is not None:
        assert len(d.gpus) == 1 and d.gpus[0].milli == request.milli
    elif request.mig_profile is not None:
        assert len(d.gpus) == 1 and d.gpus[0].mig_profile == request.mig_profile
    else:
        assert d.gpus == ()


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(state=clusters(), reqs=st.lists(requests(), min_size=1, max_size=14), data=st.data())
def test_sequences_of_placements_keep_every_invariant(state: ClusterState, reqs: list[PlacementRequest], data) -> None:
    for k, r in enumerate(reqs):
        policy = data.draw(st.sampled_from(POLICY_NAMES))
        d = place(state, r, policy=policy, seed=k)
        if isinstance(d, Placement):
            check_placement(state, r, d)
            state = state.with_holdings(d.holdings(reservation_id=k))
        else:
            assert d.reasons and all(reason.message for reason in d.reasons)
    check_invariants(state)


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(state=clusters(), reqs=st.lists(requests(), min_size=1, max_size=8), probe=requests())
def test_feasibility_does_not_depend_on_the_policy(
    state: ClusterState, reqs: list[PlacementRequest], probe: PlacementRequest
) -> None:
    for k, r in enumerate(reqs):
        d = place(state, r, policy="first_fit")
        if isinstance(d, Placement):
            state = state.with_holdings(d.holdings(reservation_id=k))
    outcomes = {p: place(state, probe, policy=p).ok for p in POLICY_NAMES}
    assert len(set(outcomes.values())) == 1, outcomes


@settings(max_examples=60, deadline=None)
@given(state=clusters(), n=st.integers(1, 4))
def test_whole_gpu_reasons_agree_with_the_counts(state: ClusterState, n: int) -> None:
    d = place(state, PlacementRequest(gpus=n, start=0, end=H))
    usable = [sum(g.healthy for g in node.gpus) for node in state.nodes if node.healthy and node.schedulable]
    if d.ok:
        assert max(usable) >= n
    elif d.code == "too_large":
        assert max(usable, default=0) < n
    elif d.code == "insufficient_capacity":
        assert sum(usable) < n
    elif d.code == "fragmented":
        assert sum(usable) >= n > max(usable)
    elif d.code == "no_gpu_model":
        assert sum(usable) == 0


def test_a_holding_that_blocks_shows_up_in_invariants() -> None:
    """The invariant checker itself catches an overcommitted GPU (so the properties can fail)."""
    state = ClusterState(
        [NodeInfo("n0", 8_000, 8_192, (GpuInfo("g", 0, "T4", 16_384),))],
        [Holding("n0", 0, H, gpu_id="g", milli=600), Holding("n0", 0, H, gpu_id="g", milli=600)],
    )
    try:
        check_invariants(state)
    except AssertionError:
        return
    raise AssertionError("overcommitted GPU not detected")


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(state=clusters(), reqs=st.lists(requests(), min_size=1, max_size=10), data=st.data())
def test_release_undoes_apply_and_arrays_stay_in_bounds(
    state: ClusterState, reqs: list[PlacementRequest], data
) -> None:
    """The benchmark's in-place path: placing then releasing everything restores the empty pool."""
    arrays = state.arrays_for_window(0, H)
    empty = arrays.copy()
    placer = Placer(arrays, get_policy(data.draw(st.sampled_from(POLICY_NAMES))), PolicyContext())
    label_masks = {}
    placed = []
    for r in reqs:
        key = tuple(sorted(r.node_labels.items()))
        label_masks.setdefault(key, state.label_mask(r.node_labels))
        d = demand_for(r)
        choice = placer.place(d, label_mask=label_masks[key])
        if choice is not None:
            placed.append((choice, d))
        assert (arrays.gpu_free >= 0).all() and (arrays.gpu_free <= 1000).all()
        assert (arrays.gpu_mem_free >= 0).all() and (arrays.gpu_mem_free <= arrays.gpu_mem_total).all()
        assert (arrays.cpu_free >= 0).all() and (arrays.mem_free >= 0).all()
    for choice, d in reversed(placed):
        placer.release(choice, d)
    for name in ("cpu_free", "mem_free", "gpu_free", "gpu_mem_free", "mig_used", "mig_media", "affinity"):
        assert np.array_equal(getattr(arrays, name), getattr(empty, name)), name
