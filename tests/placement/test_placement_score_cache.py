"""The engine's score cache: a cached score is the score a fresh ``evaluate`` gives, whatever the
cache was asked before.

The cache keeps, per key, each node's last score and the row version it was computed at; a
``node_local`` policy's score may depend on the node's row and the demand only. If the key
leaves out a field a score reads, two demands that differ only there share an entry and the
second is answered with the first's scores: the score then depends on the cache's history.
(Host memory was such a field: ``portal``'s stranding term and ``spread`` read it.)
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from allocations.placement.engine import Placer, ScoreCache, decide, feasible_nodes
from allocations.placement.policies import POLICY_NAMES, get_policy
from allocations.placement.policies.portal import PortalPolicy
from allocations.placement.requests import Demand

from .conftest import arrays_of, ctx_for

GIB = 1024

#: Work whose GPUs bring CPU and memory (so portal's stranding term reads both).
WORK = [Demand(cpu_milli=8_000, memory_mib=64 * GIB, num_gpu=1, milli=1000)] * 20 + [
    Demand(cpu_milli=4_000, memory_mib=16 * GIB, num_gpu=1, milli=500)
] * 20


def four_nodes():
    arrays = arrays_of([[1000] * 8, [1000] * 8, [500, 1000, 1000, 1000], [1000] * 4], mem=256 * GIB)
    arrays.mem_free[:] = [256 * GIB, 128 * GIB, 300 * GIB, 64 * GIB]
    return arrays


def policy(name: str):
    # guard off: the small test cluster must not make portal fall back to plain FGD.
    return PortalPolicy(guard="off") if name == "portal" else get_policy(name)


def test_two_demands_differing_only_in_host_memory_get_their_own_scores() -> None:
    arrays, ctx = four_nodes(), ctx_for(WORK)
    light = Demand(cpu_milli=4_000, memory_mib=1 * GIB, num_gpu=1, milli=500)
    heavy = dataclasses.replace(light, memory_mib=100 * GIB)
    for name in ("portal", "spread"):
        pol = policy(name)
        cache = ScoreCache(arrays.n_nodes)
        fresh = {}
        for d in (light, heavy):  # asked in turn on one cache, no placement between them
            idx, fit = feasible_nodes(arrays, d)
            cached, _ = cache.lookup(arrays, d, idx, fit, pol, ctx)
            fresh[d] = pol.evaluate(arrays, d, idx, fit, ctx).scores
            np.testing.assert_array_equal(cached, fresh[d], err_msg=f"{name}, {d.memory_mib} MiB")
        # The memory does change the scores (else the check above would prove nothing).
        assert not np.array_equal(fresh[light][:3], fresh[heavy]), name


def test_a_cached_decision_is_the_uncached_one_whatever_was_asked_before() -> None:
    """portal on four nodes: 100 GiB of host memory strands GPUs on nodes 0 and 1 (fresh scores
    4, 4, 56), so it goes to node 2; with 1 GiB it goes to node 0 (67). Asked after the 1 GiB
    demand, a cache keyed without memory sent it to node 0 too."""
    arrays, ctx = four_nodes(), ctx_for(WORK)
    light = Demand(cpu_milli=4_000, memory_mib=1 * GIB, num_gpu=1, milli=500)
    heavy = dataclasses.replace(light, memory_mib=100 * GIB)
    pol = policy("portal")
    cache = ScoreCache(arrays.n_nodes)
    assert decide(arrays, light, pol, ctx, cache=cache).node == 0
    with_cache = decide(arrays, heavy, pol, ctx, cache=cache)
    without = decide(arrays, heavy, pol, ctx)
    assert without.node == 2
    assert (with_cache.node, with_cache.score) == (without.node, without.score)


def test_the_cache_key_covers_every_field_of_a_demand() -> None:
    """Whatever field a policy reads today or tomorrow, two demands that differ in it never share
    cached scores."""
    base = Demand(
        cpu_milli=4_000, memory_mib=16 * GIB, num_gpu=1, milli=500, gpu_memory_mib=1_000,
        mig_profile=None, allowed_models=frozenset({"G2"}), min_gpu_memory_mib=2_000,
    )
    other = {
        "cpu_milli": 8_000, "memory_mib": 32 * GIB, "num_gpu": 2, "milli": 300, "gpu_memory_mib": 2_000,
        "mig_profile": "1g.10gb", "allowed_models": frozenset({"T4"}), "min_gpu_memory_mib": 4_000,
    }
    assert set(other) == {f.name for f in dataclasses.fields(Demand)}, "a new Demand field: add it here"
    for name, value in other.items():
        assert ScoreCache.key(dataclasses.replace(base, **{name: value})) != ScoreCache.key(base), name
        # A policy that does not read host memory shares an entry across it, and only across it.
        changed = ScoreCache.key(dataclasses.replace(base, **{name: value}), reads_memory=False)
        assert (changed == ScoreCache.key(base, reads_memory=False)) == (name == "memory_mib"), name


def test_policies_that_say_they_do_not_read_memory_score_the_same_whatever_the_memory() -> None:
    arrays, ctx = four_nodes(), ctx_for(WORK)
    light = Demand(cpu_milli=4_000, memory_mib=1 * GIB, num_gpu=1, milli=500)
    heavy = dataclasses.replace(light, memory_mib=100 * GIB)
    idx, fit = feasible_nodes(arrays, heavy)
    quiet = [p for p in POLICY_NAMES if not get_policy(p).reads_memory]
    assert {"fgd", "best_fit"} <= set(quiet) and "portal" not in quiet and "spread" not in quiet
    for name in quiet:
        pol = policy(name)
        a, b = pol.evaluate(arrays, light, idx, fit, ctx), pol.evaluate(arrays, heavy, idx, fit, ctx)
        np.testing.assert_array_equal(a.scores, b.scores, err_msg=name)


CPU = st.sampled_from([0, 2_000, 8_000, 24_000])
MEMORY = st.sampled_from([0, 1 * GIB, 16 * GIB, 64 * GIB, 150 * GIB])


@st.composite
def demands(draw) -> Demand:
    kind = draw(st.sampled_from(["cpu", "fraction", "whole"]))
    num, milli = {"cpu": (0, 0), "fraction": (1, draw(st.sampled_from([100, 250, 500, 810]))), "whole": (
        draw(st.integers(1, 3)), 1000
    )}[kind]
    return Demand(cpu_milli=draw(CPU), memory_mib=draw(MEMORY), num_gpu=num, milli=milli)


@pytest.mark.parametrize("name", [p for p in POLICY_NAMES if get_policy(p).node_local])
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    free=st.lists(st.lists(st.sampled_from([0, 190, 500, 1000]), min_size=1, max_size=4), min_size=2, max_size=6),
    mem=st.lists(st.sampled_from([32 * GIB, 128 * GIB, 256 * GIB]), min_size=6, max_size=6),
    asks=st.lists(st.tuples(demands(), st.booleans()), min_size=1, max_size=25),
)
def test_cached_scores_equal_a_fresh_evaluation(name, free, mem, asks) -> None:
    """Random demand sequences, each either placed or only asked about: every time, the cache's
    scores are a fresh ``evaluate`` of the same rows."""
    pol = policy(name)
    assert_the_cache_reads_as_fresh(pol, pol, free, mem, asks)


def assert_the_cache_reads_as_fresh(pol, fresh_pol, free, mem, asks) -> None:
    """Ask (and place, where the ask says so) each demand through a Placer of ``pol``: every time the cache's
    feasible nodes, scores and slots are a fresh filter's and ``fresh_pol.evaluate``'s of the same rows."""
    arrays = arrays_of(free, mem=256 * GIB)
    arrays.mem_free[:] = mem[: arrays.n_nodes]
    ctx = ctx_for(WORK)
    placer = Placer(arrays, pol, ctx)
    for demand, place in asks:
        idx, fit = feasible_nodes(arrays, demand)
        cached_idx, cached_fit = placer.cache.feasible(arrays, demand)
        np.testing.assert_array_equal(cached_idx, idx)
        np.testing.assert_array_equal(cached_fit, fit)
        if idx.size == 0:
            continue
        cached, cached_slots = placer.cache.lookup(arrays, demand, idx, fit, pol, ctx)
        ev = fresh_pol.evaluate(arrays, demand, idx, fit, ctx)
        np.testing.assert_array_equal(cached, ev.scores)
        if ev.slots is not None:
            np.testing.assert_array_equal(cached_slots, ev.slots)
        if place:
            placer.place(demand)


# ------------------------------------------------------------------ a memory sibling's scores
# A demand whose host memory the cache has not seen for its size takes, from a sibling (the same
# demand with another host memory) that scored a row in its present state, that row's score where
# the policy says host memory changes nothing there (Policy.memory_changes: for portal, where the
# stranding term's one memory-dependent part has the same bits); it scores only the other rows.


def six_nodes():
    """four_nodes plus two 8-GPU nodes with memory to spare, where host memory never strands anything."""
    arrays = arrays_of([[1000] * 8, [1000] * 8, [500, 1000, 1000, 1000], [1000] * 4, [1000] * 8, [1000] * 8],
                       mem=1024 * GIB)
    arrays.mem_free[:] = [256 * GIB, 128 * GIB, 300 * GIB, 64 * GIB, 1024 * GIB, 1024 * GIB]
    return arrays


def test_a_memory_sibling_gives_the_rows_memory_does_not_change_and_only_those() -> None:
    arrays, ctx = six_nodes(), ctx_for(WORK)
    pol = PortalPolicy(guard="off", sibling_rows=1)
    light = Demand(cpu_milli=4_000, memory_mib=1 * GIB, num_gpu=1, milli=500)
    heavy = dataclasses.replace(light, memory_mib=100 * GIB)
    cache = ScoreCache(arrays.n_nodes)
    idx, fit = feasible_nodes(arrays, light)
    cache.lookup(arrays, light, idx, fit, pol, ctx)
    assert (cache.evaluated_rows, cache.copied_rows) == (6, 0)
    differs = pol.memory_changes(arrays, heavy, light, idx, ctx)
    assert differs.any() and not differs.all()  # memory strands GPUs on some nodes, not on the two big ones
    assert not differs[4:].any()
    cached, _ = cache.lookup(arrays, heavy, idx, fit, pol, ctx)
    np.testing.assert_array_equal(cached, pol.evaluate(arrays, heavy, idx, fit, ctx).scores)
    assert cache.copied_rows == int((~differs).sum())
    assert cache.evaluated_rows == 6 + int(differs.sum())
    # Rows changed since: the sibling's score of a changed row is not taken, whatever memory says.
    arrays.apply(4, light, [0])
    third = dataclasses.replace(light, memory_mib=50 * GIB)
    idx, fit = feasible_nodes(arrays, third)
    before = cache.copied_rows
    cached, slots = cache.lookup(arrays, third, idx, fit, pol, ctx)
    fresh = pol.evaluate(arrays, third, idx, fit, ctx)
    np.testing.assert_array_equal(cached, fresh.scores)
    np.testing.assert_array_equal(slots, fresh.slots)
    taken = cache.copied_rows - before
    assert 0 < taken < idx.size  # node 4 (changed) among the rows scored


def test_memory_siblings_place_as_the_cache_without_them() -> None:
    arrays, ctx = six_nodes(), ctx_for(WORK)
    demands = [
        Demand(cpu_milli=c, memory_mib=m * GIB, num_gpu=n, milli=milli)
        for c, n, milli in [(4_000, 1, 500), (8_000, 1, 1000), (2_000, 0, 0), (16_000, 2, 1000)]
        for m in (1, 40, 100, 200)
    ] * 3
    with_siblings = Placer(arrays.copy(), PortalPolicy(guard="off", sibling_rows=1), ctx)
    without = Placer(arrays.copy(), PortalPolicy(guard="off", sibling_rows=0), ctx)
    for d in demands:
        assert with_siblings.place(d) == without.place(d)  # node, GPUs and the score's bits
    assert with_siblings.cache.copied_rows > 0 and without.cache.copied_rows == 0


@st.composite
def sibling_asks(draw) -> list[tuple[Demand, bool]]:
    """Demands of a few sizes, each asked with several host memories, placed or only asked about."""
    sizes = draw(st.lists(demands(), min_size=1, max_size=3))
    asks = draw(st.lists(st.tuples(st.integers(0, len(sizes) - 1), MEMORY, st.booleans()), min_size=1, max_size=30))
    return [(dataclasses.replace(sizes[i], memory_mib=m), place) for i, m, place in asks]


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    free=st.lists(st.lists(st.sampled_from([0, 190, 500, 1000]), min_size=1, max_size=4), min_size=2, max_size=6),
    mem=st.lists(st.sampled_from([32 * GIB, 128 * GIB, 256 * GIB]), min_size=6, max_size=6),
    asks=sibling_asks(),
    python_rows=st.sampled_from([0, PortalPolicy.python_rows]),
)
def test_scores_from_memory_siblings_equal_a_fresh_evaluation(free, mem, asks, python_rows) -> None:
    """Every re-scoring through the siblings (sibling_rows=1): the cache's scores, slots and feasible nodes
    are a fresh evaluation's, whatever siblings were asked and placed before; python_rows=0 scores
    through the NumPy stranding expressions that memory_changes reads."""
    assert_the_cache_reads_as_fresh(PortalPolicy(guard="off", sibling_rows=1, python_rows=python_rows),
                                    PortalPolicy(guard="off", python_rows=python_rows), free, mem, asks)


def test_a_cache_asked_about_another_arrays_object_scores_it_afresh() -> None:
    # Versions count one object's changes: a copy starts from the same numbers and goes its own way (intersect gives
    # a copy whose rows are the minimum of two moments, under the first one's versions). A cache that had scored the
    # first must not answer for the second from those versions.
    arrays, ctx = four_nodes(), ctx_for(WORK)
    demand = Demand(cpu_milli=4_000, memory_mib=1 * GIB, num_gpu=1, milli=500)
    pol = PortalPolicy(guard="off")
    cache = ScoreCache(arrays.n_nodes)
    later = arrays.copy()
    later.apply(0, Demand(cpu_milli=60_000, memory_mib=200 * GIB, num_gpu=7, milli=1000), list(range(7)))
    for target in (arrays, arrays.intersect(later)):
        idx, fit = cache.feasible(target, demand)
        fresh_idx, fresh_fit = feasible_nodes(target, demand)
        np.testing.assert_array_equal(idx, fresh_idx)
        np.testing.assert_array_equal(fit, fresh_fit)
        cached, _ = cache.lookup(target, demand, idx, fit, pol, ctx)
        np.testing.assert_array_equal(cached, pol.evaluate(target, demand, idx, fit, ctx).scores)
