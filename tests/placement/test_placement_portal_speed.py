"""The ``portal`` policy's fast path (issue 18, speed) against its plain formulas: the same
scores, so the same decisions, on random clusters; and the incremental per-model free count
against a fresh sum."""

from __future__ import annotations

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from allocations.placement.arrays import ClusterArrays
from allocations.placement.engine import Placer
from allocations.placement.policies.base import PolicyContext
from allocations.placement.policies.portal import PortalPolicy, _FreeByModel, _RowWatch
from allocations.placement.requests import Demand
from allocations.placement.workload import WorkloadProfile

MODELS = ["A", "B", "C"]


@st.composite
def demands(draw, pinned: bool = True) -> Demand:
    num = draw(st.sampled_from([0, 1, 1, 1, 2, 4]))
    milli = 0 if num == 0 else draw(st.sampled_from([1000, 1000, 500, 470, 250, 130])) if num == 1 else 1000
    spec = draw(st.sampled_from([frozenset(), frozenset(), frozenset({"A"}), frozenset({"B", "C"})])) if pinned else frozenset()
    return Demand(
        cpu_milli=draw(st.integers(0, 48)) * 1000,
        memory_mib=draw(st.sampled_from([0, 0, 8_192, 65_536])),  # all-zero memory: a ratio of 0
        num_gpu=num,
        milli=milli,
        allowed_models=spec if num else frozenset(),
    )


@st.composite
def clusters(draw) -> ClusterArrays:
    n = draw(st.integers(2, 10))
    gpus = [draw(st.sampled_from([0, 1, 2, 4, 8])) for _ in range(n)]
    models = [[draw(st.sampled_from(MODELS))] * g for g in gpus]
    arrays = ClusterArrays.build(
        node_ids=[f"n{i}" for i in range(n)],
        cpu_milli=[draw(st.sampled_from([2, 16, 32, 96, 128])) * 1000 for _ in range(n)],
        memory_mib=[draw(st.sampled_from([65_536, 262_144, 1 << 20])) for _ in range(n)],
        gpu_models=models,
    )
    arrays.tie_rank = np.array(draw(st.permutations(range(n))), dtype=np.int64)
    return arrays


@given(clusters(), st.lists(demands(), min_size=1, max_size=25), st.lists(demands(), min_size=1, max_size=40))
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_fast_path_places_exactly_as_the_plain_formulas(arrays, history, arrivals) -> None:
    profile = WorkloadProfile.from_demands(history)
    # A history whose GPU work asks no CPU gives a CPU ratio of 0 (never strands): the fast
    # path's offset must keep that side out of the minimum exactly as the plain path's inf.
    cpu_free = profile_without_cpu(history)
    profiles = [profile, cpu_free]
    # python_rows=0: the stranding term through NumPy for every row count; the default
    # (16): in Python floats for these small clusters' re-scorings.
    for p, python_rows in [(p, r) for p in profiles for r in (0, PortalPolicy.python_rows)]:
        fast = Placer(arrays.copy(), PortalPolicy(guard="off", python_rows=python_rows), PolicyContext(profile=p))
        plain = Placer(arrays.copy(), PortalPolicy(guard="off", fast=False), PolicyContext(profile=p))
        for demand in arrivals:
            a, b = fast.place(demand), plain.place(demand)
            assert a == b  # node, GPUs and score, bit for bit
        np.testing.assert_array_equal(fast.arrays.gpu_free, plain.arrays.gpu_free)


def every_node(arrays: ClusterArrays, demand: Demand) -> tuple[np.ndarray, np.ndarray]:
    """Every node of the cluster as a candidate, with the GPU fit the demand gets on it (CPU-only
    work: every slot, as it needs none)."""
    if demand.num_gpu == 0:
        fit = np.ones((arrays.n_nodes, arrays.gpu_free.shape[1]), dtype=bool)
    else:
        fit = (arrays.gpu_free >= demand.milli) & arrays.gpu_usable
    return np.arange(arrays.n_nodes), fit


def profile_without_cpu(history: list[Demand]) -> WorkloadProfile:
    return WorkloadProfile.from_demands(
        Demand(0 if d.num_gpu else d.cpu_milli, 0, d.num_gpu, d.milli, allowed_models=d.allowed_models) for d in history
    )


@given(clusters(), st.lists(demands(), min_size=1, max_size=25), st.data())
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_fast_scores_equal_plain_scores_for_every_candidate(arrays, history, data) -> None:
    # Not only the winner: every node's score, with and without the model balance.
    profile = data.draw(st.sampled_from([WorkloadProfile.from_demands(history), profile_without_cpu(history)]))
    ctx = PolicyContext(profile=profile)
    warm = Placer(arrays, PortalPolicy(guard="off"), ctx)
    for d in data.draw(st.lists(demands(), max_size=15)):
        warm.place(d)
    demand = data.draw(demands())
    nodes, fit = every_node(arrays, demand)
    fast, plain = PortalPolicy(guard="off"), PortalPolicy(guard="off", fast=False)
    ev_fast = fast.evaluate(arrays, demand, nodes, fit, ctx)
    ev_plain = plain.evaluate(arrays, demand, nodes, fit, ctx)
    ev_numpy = PortalPolicy(guard="off", python_rows=0).evaluate(arrays, demand, nodes, fit, ctx)
    np.testing.assert_array_equal(ev_fast.scores, ev_plain.scores)
    np.testing.assert_array_equal(ev_numpy.scores, ev_plain.scores)
    if ev_plain.slots is not None:
        np.testing.assert_array_equal(ev_fast.slots, ev_plain.slots)
        np.testing.assert_array_equal(ev_numpy.slots, ev_plain.slots)
    finite = np.isfinite(ev_plain.scores)
    if not finite.any():
        return  # the engine never scores an empty candidate list
    np.testing.assert_array_equal(
        fast.adjust(arrays, demand, nodes[finite], ev_fast.scores[finite], ctx),
        plain.adjust(arrays, demand, nodes[finite], ev_plain.scores[finite], ctx),
    )


def test_free_per_model_follows_placements_and_releases() -> None:
    # Two A nodes (2 + 4 GPUs), one B node (8), one GPU-less node: the count kept from the
    # changed rows must equal a fresh sum after every step, releases included.
    arrays = ClusterArrays.build(
        node_ids=["a0", "a1", "b0", "c0"],
        cpu_milli=[96_000] * 4,
        memory_mib=[1 << 20] * 4,
        gpu_models=[["A"] * 2, ["A"] * 4, ["B"] * 8, []],
    )
    counted = _free_counter(arrays)
    assert counted() == [6000, 8000, 0]  # A, B, GPU-less
    steps = [
        (1, Demand(4_000, 0, 2, 1000), [0, 1]),
        (2, Demand(4_000, 0, 1, 250), [3]),
        (3, Demand(4_000, 0, 0, 0), []),
        (0, Demand(4_000, 0, 1, 470), [1]),
    ]
    expected = [[4000.0, 8000.0, 0.0], [4000.0, 7750.0, 0.0], [4000.0, 7750.0, 0.0], [3530.0, 7750.0, 0.0]]
    for (node, demand, slots), want in zip(steps, expected, strict=True):
        arrays.apply(node, demand, slots)
        assert counted() == want
    arrays.release(2, Demand(4_000, 0, 1, 250), [3])
    assert counted() == [3530, 8000, 0]
    # A copy is another cluster state: the policy counts it afresh, not from the original's history.
    pinned = [Demand(4_000, 0, 1, 1000, allowed_models=frozenset({"A"}))] * 5 + [Demand(4_000, 0, 1, 500)] * 5
    policy = PortalPolicy(guard="off")
    prep = policy._prepared(WorkloadProfile.from_demands(pinned), arrays)
    assert prep.balance
    policy._count_changes(arrays, prep)
    assert policy._free.by_model == [3530, 8000, 0]
    other = arrays.copy()
    other.gpu_free[:] = 0
    policy._count_changes(other, prep)
    assert policy._free.by_model == [0, 0, 0]
    assert counted() == [3530, 8000, 0]


def _free_counter(arrays: ClusterArrays):
    """Free milli-GPU per model of ``arrays`` as the policy keeps it: one watch of the changed
    rows feeding the count."""
    watch, count = _RowWatch(arrays), _FreeByModel(arrays)

    def counted() -> list[int]:
        changed, totals = watch.poll()
        if changed:
            count.update(changed, totals)
        return count.by_model

    return counted


def test_the_guard_check_runs_in_prepare_not_in_the_first_decision(monkeypatch) -> None:
    from allocations.placement.policies import portal as portal_module

    calls = []
    monkeypatch.setattr(portal_module, "terms_help", lambda *a: calls.append(1) or True)
    arrays = ClusterArrays.build(node_ids=["x"], cpu_milli=[96_000], memory_mib=[1 << 20], gpu_models=[["A"] * 8])
    ctx = PolicyContext(profile=WorkloadProfile.from_demands([Demand(8_000, 0, 1, 1000)] * 5))
    policy = PortalPolicy()
    policy.prepare(arrays, ctx)
    assert calls == [1]
    Placer(arrays, policy, ctx).place(Demand(8_000, 0, 1, 500))
    assert calls == [1]  # the decision reused the prepared terms


def test_free_per_model_recounts_after_many_changes() -> None:
    # More changed rows than RECOUNT_ROWS since the last look: one fresh count instead of a
    # row-by-row update; both must agree with a plain sum, and the row-by-row path resumes after.
    from allocations.placement.policies.portal import _FreeByModel

    n = 2 * _FreeByModel.RECOUNT_ROWS
    arrays = ClusterArrays.build(
        node_ids=[f"n{i}" for i in range(n)],
        cpu_milli=[96_000] * n,
        memory_mib=[1 << 20] * n,
        gpu_models=[["A"] * 4 if i % 3 else ["B"] * 2 for i in range(n)],
    )
    counted = _free_counter(arrays)

    def fresh() -> list[int]:
        free = arrays.gpu_free.sum(axis=1)
        return [int(free[arrays.model_idx == m].sum()) for m in (0, 1)] + [0]

    assert counted() == fresh()
    for node in range(_FreeByModel.RECOUNT_ROWS + 5):
        arrays.apply(node, Demand(1_000, 0, 1, 300), [0])
    assert counted() == fresh()
    arrays.apply(n - 1, Demand(1_000, 0, 1, 700), [1])
    assert counted() == fresh()


@given(clusters(), st.lists(demands(), min_size=1, max_size=25), st.data())
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_one_row_per_class_scores_every_row_as_scoring_each(arrays, history, data) -> None:
    # class_rows=1: every evaluation scores one row per class of identical rows and spreads the
    # result; class_rows=0 scores each row. Same scores and slots for every candidate, and so
    # the same decisions (with the engine's tie-break by node order among a class's nodes).
    ctx = PolicyContext(profile=WorkloadProfile.from_demands(history))
    for d in data.draw(st.lists(demands(), max_size=15)):
        Placer(arrays, PortalPolicy(guard="off"), ctx).place(d)
    demand = data.draw(demands())
    nodes, fit = every_node(arrays, demand)
    by_class = PortalPolicy(guard="off", class_rows=1).evaluate(arrays, demand, nodes, fit, ctx)
    each = PortalPolicy(guard="off", class_rows=0).evaluate(arrays, demand, nodes, fit, ctx)
    np.testing.assert_array_equal(by_class.scores, each.scores)
    if each.slots is not None:
        np.testing.assert_array_equal(by_class.slots, each.slots)


@given(clusters(), st.lists(demands(), min_size=1, max_size=25), st.lists(demands(), min_size=1, max_size=40))
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_one_row_per_class_places_as_scoring_each(arrays, history, arrivals) -> None:
    # Copies of each node make classes of several nodes: the tie-break among them is the node order.
    n = arrays.n_nodes
    twice = ClusterArrays.build(
        node_ids=[f"n{i}" for i in range(2 * n)],
        cpu_milli=np.tile(arrays.cpu_cap, 2),
        memory_mib=np.tile(arrays.mem_cap, 2),
        gpu_models=[[arrays.models[m] for m in row if m >= 0] for row in arrays.gpu_model.tolist()] * 2,
        tie_rank=np.random.default_rng(n).permutation(2 * n),
    )
    ctx = PolicyContext(profile=WorkloadProfile.from_demands(history))
    by_class = Placer(twice.copy(), PortalPolicy(guard="off", class_rows=1), ctx)
    each = Placer(twice.copy(), PortalPolicy(guard="off", class_rows=0), ctx)
    for demand in arrivals:
        assert by_class.place(demand) == each.place(demand)


@given(clusters(), st.lists(demands(), max_size=15), st.data())
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_row_classes_group_exactly_the_equal_rows(arrays, placed, data) -> None:
    from allocations.placement.policies.portal import row_classes

    ctx = PolicyContext(profile=WorkloadProfile.from_demands(placed or [Demand(1_000, 0, 1, 500)]))
    for d in placed:
        Placer(arrays, PortalPolicy(guard="off"), ctx).place(d)
    nodes = np.array(data.draw(st.lists(st.integers(0, arrays.n_nodes - 1), min_size=1, max_size=30)))
    fit = np.array(data.draw(st.lists(st.lists(st.booleans(), min_size=arrays.max_gpus, max_size=arrays.max_gpus),
                                       min_size=len(nodes), max_size=len(nodes))))
    first, inverse = row_classes(arrays, nodes, fit)
    rows = [
        (int(arrays.model_idx[n]), int(arrays.cpu_free[n]), int(arrays.mem_free[n]), tuple(arrays.gpu_free[n].tolist()), tuple(f.tolist()))
        for n, f in zip(nodes.tolist(), fit)
    ]
    assert len(first) == len(set(rows))  # one class per distinct row
    assert [rows[first[c]] for c in inverse] == rows  # every row is its class's representative


@given(clusters(), st.lists(demands(), min_size=1, max_size=25), st.data())
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_where_memory_changes_nothing_two_memories_score_alike(arrays, history, data) -> None:
    # The promise the score cache takes a sibling's scores on (PortalPolicy.memory_changes): on every
    # node it says host memory changes nothing, the two demands get the same score and slot, bit for
    # bit, through either stranding path (Python floats for few rows, NumPy expressions).
    import dataclasses

    profile = data.draw(st.sampled_from([WorkloadProfile.from_demands(history), profile_without_cpu(history)]))
    ctx = PolicyContext(profile=profile)
    for d in data.draw(st.lists(demands(), max_size=15)):
        Placer(arrays, PortalPolicy(guard="off"), ctx).place(d)
    demand = data.draw(demands())
    other = dataclasses.replace(demand, memory_mib=data.draw(st.sampled_from([0, 4_096, 65_536, 300_000])))
    nodes, fit = every_node(arrays, demand)
    for python_rows in (0, PortalPolicy.python_rows):
        pol = PortalPolicy(guard="off", python_rows=python_rows)
        same = ~pol.memory_changes(arrays, demand, other, nodes, ctx)
        a, b = pol.evaluate(arrays, demand, nodes, fit, ctx), pol.evaluate(arrays, other, nodes, fit, ctx)
        np.testing.assert_array_equal(a.scores[same], b.scores[same])
        if a.slots is not None:
            np.testing.assert_array_equal(a.slots[same], b.slots[same])


def test_memory_changes_promises_nothing_off_the_fast_path() -> None:
    arrays = ClusterArrays.build(node_ids=["x"], cpu_milli=[96_000], memory_mib=[1 << 20], gpu_models=[["A"] * 8])
    ctx = PolicyContext(profile=WorkloadProfile.from_demands([Demand(8_000, 65_536, 1, 1000)] * 5))
    d, other = Demand(8_000, 0, 1, 500), Demand(8_000, 65_536, 1, 500)
    nodes = np.arange(1)
    assert PortalPolicy(guard="off").memory_changes(arrays, d, other, nodes, ctx) is not None
    for pol in (PortalPolicy(guard="off", fast=False), PortalPolicy(guard="off", per_model=False), PortalPolicy(guard="fgd")):
        assert pol.memory_changes(arrays, d, other, nodes, ctx) is None
