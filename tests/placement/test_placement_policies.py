"""Small hand-made clusters where the right answer of each policy is known."""

from __future__ import annotations

import numpy as np
import pytest

from allocations.placement.engine import Placer, decide, pick_best
from allocations.placement.policies import POLICY_NAMES, get_policy
from allocations.placement.requests import Demand

from .conftest import arrays_of, ctx_for

ONE_GPU = Demand(cpu_milli=8_000, memory_mib=16_384, num_gpu=1, milli=1000)


def choose(policy: str, arrays, demand: Demand, ctx=None):
    choice = decide(arrays, demand, get_policy(policy), ctx or ctx_for())
    assert choice is not None
    return choice


def test_every_policy_is_registered() -> None:
    assert set(POLICY_NAMES) == {
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
    with pytest.raises(ValueError, match="unknown policy"):
        get_policy("nope")


def test_best_fit_takes_the_fullest_node_and_spread_the_emptiest() -> None:
    arrays = arrays_of([[1000, 1000, 1000, 1000], [1000, 0, 0, 0]])
    assert choose("best_fit", arrays, ONE_GPU).node == 1
    assert choose("spread", arrays, ONE_GPU).node == 0


def test_best_fit_score_matches_the_reference_formula() -> None:
    arrays = arrays_of([[1000, 1000, 500, 0]], cpu_free=[40_000])
    ev = get_policy("best_fit").evaluate(
        arrays, ONE_GPU, np.array([0]), np.array([[True, True, False, False]]), ctx_for()
    )
    left = 0.5 * (40_000 - 8_000) / 128_000 + 0.5 * (2_500 - 1_000) / 8_000
    assert ev.scores[0] == int(100 * (1 - left))


def test_first_fit_follows_node_order() -> None:
    arrays = arrays_of([[0, 0], [1000, 1000], [1000, 1000]])
    arrays.tie_rank = np.array([0, 2, 1])  # node 2 comes before node 1
    assert choose("first_fit", arrays, ONE_GPU).node == 2


def test_ties_go_to_the_lowest_tie_rank() -> None:
    assert pick_best(np.array([3.0, 5.0, 5.0, 1.0]), np.array([0, 9, 4, 1])) == 2


def test_fractional_demand_takes_the_tightest_gpu_under_best_fit() -> None:
    arrays = arrays_of([[1000, 700, 400, 350]])
    d = Demand(cpu_milli=1_000, memory_mib=1_024, num_gpu=1, milli=350)
    assert choose("best_fit", arrays, d).slots == (3,)
    assert choose("spread", arrays, d).slots == (0,)
    assert choose("first_fit", arrays, d).slots == (0,)


def test_packing_prefers_shared_gpu_then_used_node_then_idle_node() -> None:
    share = Demand(cpu_milli=1_000, memory_mib=1_024, num_gpu=1, milli=300)
    idle, used, shared = [1000] * 4, [1000, 1000, 1000, 0], [1000, 1000, 1000, 600]
    assert choose("packing", arrays_of([idle, used, shared]), share).node == 2
    assert choose("packing", arrays_of([idle, used, shared]), share).slots == (3,)
    assert choose("packing", arrays_of([idle, used]), share).node == 1
    assert choose("packing", arrays_of([idle, used]), ONE_GPU).node == 1


def test_clustering_keeps_tags_together() -> None:
    arrays = arrays_of([[1000] * 4, [1000] * 4, [1000] * 4])
    arrays.affinity[1, 0] = 1  # node 1 hosts a shared-GPU task
    arrays.affinity[2, 1] = 1  # node 2 hosts a 1-GPU task
    share = Demand(cpu_milli=1_000, memory_mib=1_024, num_gpu=1, milli=300)
    assert choose("clustering", arrays, share).node == 1
    assert choose("clustering", arrays, ONE_GPU).node == 2


def test_dot_product_prefers_the_smallest_alignment() -> None:
    # Same CPU everywhere; the node with less free GPU has the smaller dot product.
    arrays = arrays_of([[1000, 1000, 1000, 1000], [1000, 0, 0, 0]])
    assert choose("dot_product", arrays, ONE_GPU).node == 1
    # A fractional demand prefers a partial GPU that fits over an idle one.
    share = Demand(cpu_milli=1_000, memory_mib=1_024, num_gpu=1, milli=300)
    assert choose("dot_product", arrays_of([[1000, 400, 1000]]), share).slots == (1,)


def test_random_only_picks_feasible_nodes_and_varies() -> None:
    arrays = arrays_of([[1000], [0], [1000], [1000]])
    seen = {choose("random", arrays, ONE_GPU, ctx_for(seed=s)).node for s in range(40)}
    assert seen == {0, 2, 3}


def test_fgd_fills_the_remnant_that_whole_gpu_work_cannot_use() -> None:
    # Work is mostly whole GPUs: a GPU with 600 free is fragment for them, a full one is not.
    mix = [Demand(8_000, 0, 1, 1000)] * 8 + [Demand(2_000, 0, 1, 500)] * 2
    ctx = ctx_for(mix)
    share = Demand(cpu_milli=2_000, memory_mib=0, num_gpu=1, milli=500)
    arrays = arrays_of([[1000, 1000], [1000, 600]])
    choice = choose("fgd", arrays, share, ctx)
    assert (choice.node, choice.slots) == (1, (1,))


def test_portal_keeps_cpu_for_free_gpus() -> None:
    # Node 0: 2 free GPUs and just the CPU they need (work brings 10 cores per GPU);
    # node 1: all GPUs busy but lots of CPU. CPU-only work belongs on node 1.
    mix = [Demand(10_000, 0, 1, 1000)] * 9 + [Demand(4_000, 0, 0, 0)]
    ctx = ctx_for(mix)
    arrays = arrays_of([[1000, 1000, 0, 0], [0, 0, 0, 0]], cpu_free=[20_000, 60_000])
    arrays.tie_rank = np.array([0, 1])  # node 0 would win a tie
    cpu_only = Demand(cpu_milli=4_000, memory_mib=0, num_gpu=0, milli=0)
    assert choose("portal", arrays, cpu_only, ctx).node == 1
    assert choose("fgd", arrays, cpu_only, ctx).node == 0  # FGD sees no fragment change: tie


def test_portal_avoids_remnants_no_common_size_fits() -> None:
    # 470s and 320s are common. 530 free (next to a 470) is one 470 away from 60 idle;
    # 320 there would leave 210 that nothing common fills. 680 free takes the 320 better.
    mix = [Demand(4_000, 0, 1, 470)] * 40 + [Demand(4_000, 0, 1, 320)] * 30 + [Demand(10_000, 0, 1, 1000)] * 30
    ctx = ctx_for(mix)
    arrays = arrays_of([[530, 0, 0, 0], [680, 0, 0, 0]])
    d320 = Demand(cpu_milli=4_000, memory_mib=0, num_gpu=1, milli=320)
    assert choose("portal", arrays, d320, ctx).node == 1
    assert choose("fgd", arrays, d320, ctx).node == 0  # FGD's one-step measure prefers the 530


@pytest.mark.parametrize("policy", POLICY_NAMES)
def test_whole_gpus_take_the_first_free_indexes(policy: str) -> None:
    arrays = arrays_of([[0, 1000, 300, 1000, 1000]])
    two = Demand(cpu_milli=1_000, memory_mib=0, num_gpu=2, milli=1000)
    assert choose(policy, arrays, two).slots == (1, 3)


@pytest.mark.parametrize("policy", POLICY_NAMES)
def test_no_feasible_node_gives_none(policy: str) -> None:
    arrays = arrays_of([[1000, 0], [500, 500]])
    assert decide(arrays, Demand(1_000, 0, 2, 1000), get_policy(policy), ctx_for()) is None


@pytest.mark.parametrize("policy", [p for p in POLICY_NAMES if p != "random"])
def test_score_cache_gives_the_same_decisions_as_scoring_afresh(policy: str) -> None:
    rng = np.random.default_rng(7)
    demands = []
    for _ in range(120):
        num = int(rng.choice([0, 1, 1, 1, 2, 4]))
        milli = 0 if num == 0 else 1000
        if num == 1 and rng.random() < 0.5:
            milli = int(rng.integers(1, 10)) * 100
        demands.append(Demand(int(rng.integers(1, 16)) * 1_000, 1_024, num, milli))
    a = Placer(arrays_of([[1000] * 4] * 6 + [[1000] * 8] * 3, cpu_cap=64_000), get_policy(policy), ctx_for(demands))
    b = Placer(
        arrays_of([[1000] * 4] * 6 + [[1000] * 8] * 3, cpu_cap=64_000),
        get_policy(policy),
        ctx_for(demands),
        use_cache=False,
    )
    for d in demands:
        ca, cb = a.place(d), b.place(d)
        assert (ca is None) == (cb is None)
        if ca is not None and cb is not None:
            assert (ca.node, ca.slots) == (cb.node, cb.slots)
    assert np.array_equal(a.arrays.gpu_free, b.arrays.gpu_free)
