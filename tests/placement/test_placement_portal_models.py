"""The ``portal`` policy's per-model terms (issue 18): hand-made clusters where the right choice is known,
and properties that hold on any cluster."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from allocations.placement import ClusterState, PlacementRequest, place
from allocations.placement.arrays import ClusterArrays
from allocations.placement.engine import decide
from allocations.placement.policies import get_policy
from allocations.placement.policies import portal as portal_module
from allocations.placement.policies.base import PolicyContext
from allocations.placement.policies.portal import PortalPolicy, cluster_types, terms_help
from allocations.placement.requests import Demand
from allocations.placement.workload import WorkloadProfile, remnant_waste_table

from .conftest import make_node


def two_model_cluster(
    free: list[list[int]], models: list[str], cpu_free: list[int], cpu_cap: int = 96_000
) -> ClusterArrays:
    arrays = ClusterArrays.build(
        node_ids=[f"n{i}" for i in range(len(free))],
        cpu_milli=[cpu_cap] * len(free),
        memory_mib=[512 * 1024] * len(free),
        gpu_models=[[m] * len(f) for f, m in zip(free, models, strict=True)],
    )
    for i, f in enumerate(free):
        arrays.gpu_free[i, : len(f)] = f
    arrays.cpu_free[:] = cpu_free
    return arrays


def ctx(demands: list[Demand]) -> PolicyContext:
    return PolicyContext(profile=WorkloadProfile.from_demands(demands))


def pinned(model: str, cpu: int, n: int, milli: int = 1000) -> list[Demand]:
    return [Demand(cpu_milli=cpu, memory_mib=0, num_gpu=1, milli=milli, allowed_models=frozenset({model}))] * n


def anywhere(cpu: int, n: int, milli: int = 1000) -> list[Demand]:
    return [Demand(cpu_milli=cpu, memory_mib=0, num_gpu=1, milli=milli)] * n


def pick(policy: PortalPolicy, arrays: ClusterArrays, demand: Demand, c: PolicyContext) -> int:
    choice = decide(arrays, demand, policy, c)
    assert choice is not None
    return choice.node


# ------------------------------------------------------------------ hand-made clusters
def test_stranding_uses_the_ratio_of_the_work_that_can_use_the_model() -> None:
    # T-pinned work brings 40 cores per GPU, work that runs anywhere 5. Cluster-wide that is
    # 22.5 per GPU, which makes 10 cores next to G's 2 free GPUs look like stranding; but
    # only the 5-core work ever comes to G, while T's 2 free GPUs need 80 of its 60 cores.
    c = ctx(pinned("T", 40_000, 50) + anywhere(5_000, 50))
    arrays = two_model_cluster([[1000, 1000], [1000, 1000]], ["T", "G"], cpu_free=[60_000, 30_000])
    arrays.tie_rank = np.array([0, 1])  # T would win a tie
    cpu_only = Demand(cpu_milli=20_000, memory_mib=0, num_gpu=0, milli=0)
    assert pick(PortalPolicy(guard="off"), arrays, cpu_only, c) == 1
    assert pick(PortalPolicy(guard="off", per_model=False), arrays, cpu_only, c) == 0  # the old, single ratio


def test_work_that_runs_anywhere_leaves_room_on_the_model_pinned_work_needs() -> None:
    # Half the work may only use model A; an unrestricted GPU goes to B once A is filling up.
    c = ctx(pinned("A", 8_000, 50) + anywhere(8_000, 50))
    arrays = two_model_cluster(
        [[1000, 1000, 0, 0], [1000, 1000, 0, 0]], ["A", "B"], cpu_free=[80_000, 80_000]
    )
    arrays.tie_rank = np.array([0, 1])  # A would win a tie: both nodes score the same in evaluate
    one = anywhere(8_000, 1)[0]
    assert pick(PortalPolicy(guard="off"), arrays, one, c) == 1
    assert pick(PortalPolicy(guard="off", balance_weight=0), arrays, one, c) == 0
    # Pinned work has no choice to make and still goes to its model.
    assert pick(PortalPolicy(guard="off"), arrays, pinned("A", 8_000, 1)[0], c) == 0


def test_two_models_each_with_pinned_fractions_get_their_own_remnant_table() -> None:
    # Work pinned to A comes in 470s, work pinned to B in 320s. On A, 530 free is one 470
    # away from 60 idle; on B, 530 free is one 320 away from 210 (and 210 fits nothing).
    c = ctx(pinned("A", 2_000, 60, milli=470) + pinned("B", 2_000, 60, milli=320))
    terms = c.profile.model_terms(["A", "B"], cluster_types(two_model_cluster([[1000], [1000]], ["A", "B"], [1, 1])))
    assert terms.waste[0][530] == remnant_waste_table([470])[530] == 60
    assert terms.waste[1][530] == remnant_waste_table([320])[530] == 210
    # A 470 that may use either model goes to A's 530 (60 left, as good as A's work gets),
    # not to B's 640, which two of B's 320s would fill exactly (170 left, which nothing fills).
    arrays = two_model_cluster([[530], [640]], ["A", "B"], cpu_free=[96_000, 96_000])
    arrays.tie_rank = np.array([1, 0])
    either = Demand(cpu_milli=2_000, memory_mib=0, num_gpu=1, milli=470)
    assert pick(PortalPolicy(guard="off", balance_weight=0), arrays, either, c) == 0


def test_a_task_only_big_nodes_can_take_counts_as_pinned_to_them() -> None:
    # 8 GPUs and 120 cores fit only the 128-core node type, whatever gpu_spec says.
    big = [Demand(cpu_milli=120_000, memory_mib=0, num_gpu=8, milli=1000)] * 10
    c = ctx(big + anywhere(4_000, 90))
    arrays = ClusterArrays.build(
        node_ids=["small", "big"],
        cpu_milli=[96_000, 128_000],
        memory_mib=[512 * 1024] * 2,
        gpu_models=[["G2"] * 8, ["G3"] * 8],
    )
    terms = c.profile.model_terms(arrays.models, cluster_types(arrays))
    g2, g3 = arrays.models.index("G2"), arrays.models.index("G3")
    assert terms.pinned_share[g2] == 0.0
    # 80 of the 170 GPUs' worth of work that can use G3 is tied to it, each with the half
    # of the cluster's GPUs it cannot use: 40 / 170.
    assert terms.pinned_share[g3] == pytest.approx(40 / 170)
    # and G3's typical shapes include the 8-GPU task, G2's do not
    shapes = terms.shapes
    eight = [j for j, s in enumerate(shapes.shapes) if s.num_gpu == 8]
    assert eight and shapes.p_model_gpu[g3][[shapes.needs_gpu.nonzero()[0].tolist().index(j) for j in eight]].sum() > 0
    assert shapes.p_model_gpu[g2][[shapes.needs_gpu.nonzero()[0].tolist().index(j) for j in eight]].sum() == 0


def test_guard_fgd_scores_exactly_as_fgd() -> None:
    c = ctx(pinned("A", 8_000, 50) + anywhere(8_000, 50))
    arrays = two_model_cluster([[1000, 300, 0], [700, 1000, 1000]], ["A", "B"], cpu_free=[40_000, 90_000])
    nodes = np.array([0, 1])
    for demand in (anywhere(4_000, 1, milli=300)[0], anywhere(8_000, 1)[0]):
        fit = arrays.gpu_free[nodes] >= demand.milli
        ours = PortalPolicy(guard="fgd").evaluate(arrays, demand, nodes, fit, c)
        fgd = get_policy("fgd").evaluate(arrays, demand, nodes, fit, c)
        assert np.array_equal(ours.scores, fgd.scores)
        assert np.array_equal(PortalPolicy(guard="fgd").adjust(arrays, demand, nodes, ours.scores, c), ours.scores)


def test_guard_auto_falls_back_to_fgd_when_the_check_says_the_terms_hurt(monkeypatch) -> None:
    c = ctx(pinned("A", 8_000, 50) + anywhere(8_000, 50))
    arrays = two_model_cluster([[1000, 1000, 0, 0], [1000, 1000, 0, 0]], ["A", "B"], cpu_free=[80_000, 80_000])
    one = anywhere(8_000, 1)[0]
    nodes = np.array([0, 1])
    fit = arrays.gpu_free[nodes] >= 1000
    fgd = get_policy("fgd").evaluate(arrays, one, nodes, fit, c).scores
    unguarded = PortalPolicy(guard="off")
    ours = unguarded.evaluate(arrays, one, nodes, fit, c).scores
    assert not np.array_equal(unguarded.adjust(arrays, one, nodes, ours, c), fgd)
    monkeypatch.setattr(portal_module, "terms_help", lambda *args: False)
    policy = PortalPolicy()
    ours = policy.evaluate(arrays, one, nodes, fit, c).scores
    assert np.array_equal(ours, fgd) and np.array_equal(policy.adjust(arrays, one, nodes, ours, c), fgd)


def test_the_check_runs_once_per_profile_and_cluster() -> None:
    c = ctx(pinned("A", 8_000, 50) + anywhere(8_000, 50))
    arrays = two_model_cluster([[1000] * 4] * 6, ["A", "A", "A", "B", "B", "B"], cpu_free=[96_000] * 6)
    policy = PortalPolicy()
    types = cluster_types(arrays)
    first = terms_help(policy, c.profile, arrays, types)
    assert isinstance(first, bool)
    key = (id(c.profile), tuple(arrays.models), types, tuple(policy.constants().items()))
    assert portal_module._CHECKS[key] == (c.profile, first)


def test_real_pools_reach_the_per_model_terms_through_place() -> None:
    # The portal's one seam (allocations.booking -> placement.place) with the pool's policy name.
    state = ClusterState(
        [make_node("a0", 4, model="A", cpu=96_000), make_node("b0", 4, model="B", cpu=96_000)]
    )
    profile = WorkloadProfile.from_demands(pinned("A", 8_000, 50) + anywhere(8_000, 50))
    first = place(state, PlacementRequest(gpus=2, cpu_milli=8_000, allowed_models={"A"}), "portal", profile=profile)
    assert first.ok and first.node_id == "a0"
    state = state.with_holdings(first.holdings(reservation_id=1, team=None))
    second = place(state, PlacementRequest(gpus=2, cpu_milli=8_000), "portal", profile=profile)
    assert second.ok and second.node_id == "b0" and second.policy == "portal"
    # A task for A still finds its model's last two GPUs.
    third = place(state.with_holdings(second.holdings(reservation_id=2, team=None)),
                  PlacementRequest(gpus=2, cpu_milli=8_000, allowed_models={"A"}), "portal", profile=profile)
    assert third.ok and third.node_id == "a0"


# ------------------------------------------------------------------ properties
@st.composite
def mixed_clusters(draw):
    n = draw(st.integers(2, 8))
    models = [draw(st.sampled_from(["A", "B", "C"])) for _ in range(n)]
    gpus = [draw(st.integers(1, 4)) for _ in range(n)]
    free = [[draw(st.sampled_from([0, 250, 500, 530, 1000])) for _ in range(g)] for g in gpus]
    cpu = [draw(st.integers(0, 96)) * 1000 for _ in range(n)]
    arrays = two_model_cluster(free, models, cpu)
    work = []
    for _ in range(draw(st.integers(1, 6))):
        spec = draw(st.sampled_from([frozenset(), frozenset({"A"}), frozenset({"B", "C"})]))
        milli = draw(st.sampled_from([250, 470, 1000]))
        work += [Demand(draw(st.integers(0, 16)) * 1000, 0, 1, milli, allowed_models=spec)] * draw(st.integers(1, 5))
    return arrays, work


@given(mixed_clusters(), st.sampled_from([250, 470, 1000]), st.integers(0, 16))
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_model_balance_keeps_the_order_within_a_model(case, milli, cpu) -> None:
    arrays, work = case
    c = ctx(work)
    demand = Demand(cpu * 1000, 0, 1, milli)
    nodes = np.arange(arrays.n_nodes)
    fit = (arrays.gpu_free >= milli) & arrays.gpu_usable
    policy = PortalPolicy(guard="off")
    scores = policy.evaluate(arrays, demand, nodes, fit, c).scores
    adjusted = policy.adjust(arrays, demand, nodes, scores, c)
    finite = np.isfinite(scores)
    assert np.all(adjusted[finite] <= scores[finite])  # a charge, never a bonus
    # The model balance alone: the whole-node term charges a node still whole and not one already broken, so it
    # may well order two nodes of one model (single-GPU nodes hold whole-node work: a full 1-GPU task).
    balance_only = PortalPolicy(guard="off", whole_weight=0)
    adjusted = balance_only.adjust(arrays, demand, nodes, balance_only.evaluate(arrays, demand, nodes, fit, c).scores, c)
    for m in set(arrays.model_idx.tolist()):
        same = nodes[(arrays.model_idx == m) & finite]
        if same.size == 0:
            continue
        # Within one model the charge is one number: the order of nodes cannot change.
        charge = scores[same] - adjusted[same]
        assert np.allclose(charge, charge[0])


@given(mixed_clusters())
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_per_model_terms_are_bounded_and_reduce_to_the_global_ones_without_restrictions(case) -> None:
    arrays, work = case
    profile = WorkloadProfile.from_demands(work)
    terms = profile.model_terms(arrays.models, cluster_types(arrays))
    assert np.all((terms.pinned_share >= 0) & (terms.pinned_share < 1))
    # Per model, the shape frequencies of the work that can use it sum to 1 (or 0: none can).
    sums = terms.shapes.p_model_gpu.sum(axis=1) + terms.shapes.p_model_cpu_only
    assert np.all(np.isclose(sums[:-1], 1.0) | np.isclose(sums[:-1], 0.0))
    # With no restriction and every task fitting everywhere, every model sees the whole workload.
    free_work = [Demand(d.cpu_milli, 0, 1, d.milli) for d in work]
    plain = WorkloadProfile.from_demands(free_work)
    big = ClusterArrays.build(
        node_ids=["x", "y"], cpu_milli=[128_000] * 2, memory_mib=[1 << 20] * 2, gpu_models=[["A"] * 4, ["B"] * 4]
    )
    t = plain.model_terms(big.models, cluster_types(big))
    assert not t.pinned_share.any()
    assert np.allclose(t.cpu_per_gpu, plain.cpu_per_gpu_milli)
    assert all(np.array_equal(row, plain.remnant_waste) for row in t.waste)


@pytest.mark.parametrize("guard", ["auto", "off", "fgd"])
def test_every_guard_setting_places_the_trace_like_demands(guard: str) -> None:
    c = ctx(pinned("A", 8_000, 30) + anywhere(4_000, 30, milli=500) + anywhere(8_000, 30))
    arrays = two_model_cluster([[1000] * 4] * 4, ["A", "A", "B", "B"], cpu_free=[96_000] * 4)
    policy = PortalPolicy(guard=guard)
    placed = 0
    for d in (pinned("A", 8_000, 6) + anywhere(4_000, 6, milli=500) + anywhere(8_000, 4)):
        choice = decide(arrays, d, policy, c)
        if choice is not None:
            arrays.apply(choice.node, d, choice.slots)
            placed += d.total_milli
    assert placed == 6 * 1000 + 6 * 500 + 4 * 1000  # everything fits this cluster
