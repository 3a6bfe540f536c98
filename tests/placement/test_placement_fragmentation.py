"""The FGD fragmentation measure against hand computation, and its incremental form."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from allocations.placement.fragmentation import (
    FragmentTerms,
    ShapeTable,
    TaskShape,
    cluster_fragment,
    node_fragment,
    typical_shapes,
)
from allocations.placement.workload import remnant_waste_table

from .conftest import arrays_of

SHARE = TaskShape(2_000, 500, 1)
WHOLE_HUNGRY = TaskShape(20_000, 1_000, 1)
CPU_ONLY = TaskShape(1_000, 0, 0)


def table(shapes: list[tuple[TaskShape, float]], models: list[str] | None = None) -> ShapeTable:
    return ShapeTable(shapes, models or ["G2"])


def test_hand_computed_node_fragment() -> None:
    # GPUs free 1000, 600, 200, 0 (total 1800); 10 cores free.
    t = table([(SHARE, 0.5), (WHOLE_HUNGRY, 0.3), (CPU_ONLY, 0.2)])
    f = node_fragment(np.array([[1000, 600, 200, 0]]), np.array([10_000]), np.array([0]), t)
    # SHARE fits: only the GPUs with < 500 free are fragment: 200 + 0.
    # WHOLE_HUNGRY lacks CPU: everything (1800). CPU_ONLY never uses GPUs: everything.
    assert f[0] == pytest.approx(0.5 * 200 + 0.3 * 1800 + 0.2 * 1800)


def test_shape_that_cannot_run_on_the_model_sees_all_free_gpu_as_fragment() -> None:
    t4_only = TaskShape(1_000, 300, 1, "T4")
    t = ShapeTable([(t4_only, 1.0)], ["G2", "T4"])
    free = np.array([[1000, 500], [1000, 500]])
    f = node_fragment(free, np.array([50_000, 50_000]), np.array([0, 1]), t)
    assert f[0] == 1500  # G2 node: no access
    assert f[1] == 0  # T4 node: both GPUs have >= 300 free


def test_multi_gpu_shape_needs_enough_gpus() -> None:
    two = TaskShape(1_000, 1_000, 2)
    t = table([(two, 1.0)])
    f = node_fragment(np.array([[1000, 900, 1000], [1000, 900, 0]]), np.array([8_000, 8_000]), np.array([0, 0]), t)
    assert f[0] == 900  # fits on the two full GPUs; the 900 is fragment
    assert f[1] == 1900  # only one full GPU: all free is fragment


def test_cluster_fragment_is_the_sum_over_nodes() -> None:
    t = table([(SHARE, 0.7), (CPU_ONLY, 0.3)])
    arrays = arrays_of([[1000, 300], [200, 200, 900]])
    per_node = node_fragment(arrays.gpu_free, arrays.cpu_free, arrays.model_idx, t)
    assert cluster_fragment(arrays, t) == pytest.approx(per_node.sum())
    assert per_node[0] == pytest.approx(0.7 * 300 + 0.3 * 1300)


def test_typical_shapes_cover_95_percent_and_renormalise() -> None:
    shapes = [SHARE] * 60 + [WHOLE_HUNGRY] * 30 + [CPU_ONLY] * 6 + [TaskShape(1, 1, 1)] * 4
    kept = typical_shapes(shapes, 0.95)
    assert [s for s, _ in kept] == [SHARE, WHOLE_HUNGRY, CPU_ONLY]  # 96% >= 95%: stop
    assert sum(p for _, p in kept) == pytest.approx(1.0)
    assert kept[0][1] == pytest.approx(60 / 96)


def test_typical_shapes_break_count_ties_by_larger_shape_first() -> None:
    a, b = TaskShape(1_000, 500, 1), TaskShape(2_000, 500, 1)
    kept = typical_shapes([a, b], 0.5)
    assert kept[0][0] == b and len(kept) == 1


def test_empty_trace_cluster_fragment_is_about_14_percent() -> None:
    from benchmarks.placement_trace import DEFAULT_NODES, DEFAULT_TRACE, load_nodes, load_trace

    if not DEFAULT_TRACE.exists():
        pytest.fail(f"the Alibaba trace is missing at {DEFAULT_TRACE}: check out ../shared beside the repository")
    nodes = load_nodes(DEFAULT_NODES)
    trace = load_trace(DEFAULT_TRACE)
    t = ShapeTable(trace.typical_shapes(), nodes.models)
    pct = 100 * cluster_fragment(nodes, t) / nodes.gpu_capacity_milli()
    assert 12.0 < pct < 16.0  # "even an empty cluster measures about 14%" (data README)


free_rows = st.lists(st.integers(0, 1000), min_size=1, max_size=8)


@settings(max_examples=150, deadline=None)
@given(free=free_rows, cpu=st.integers(0, 40_000), take=st.integers(1, 999), data=st.data())
def test_incremental_terms_match_recomputation(free: list[int], cpu: int, take: int, data: st.DataObject) -> None:
    t = table(
        [
            (SHARE, 0.4),
            (WHOLE_HUNGRY, 0.2),
            (TaskShape(3_000, 810, 1), 0.2),
            (TaskShape(8_000, 1_000, 2), 0.1),
            (CPU_ONLY, 0.1),
        ]
    )
    row = np.array([free])
    terms = FragmentTerms(row, np.array([cpu]), np.array([0]), t)
    assert terms.value()[0] == pytest.approx(node_fragment(row, np.array([cpu]), np.array([0]), t)[0])
    g = data.draw(st.integers(0, len(free) - 1))
    new = max(0, free[g] - take)
    after = row.copy()
    after[0, g] = new
    expected = node_fragment(after, np.array([cpu - 1_000]), np.array([0]), t)[0]
    got = terms.after_one_gpu(np.array([0]), np.array([free[g]]), np.array([new]), np.array([cpu - 1_000]))[0]
    assert got == pytest.approx(expected)
    full = [i for i, f in enumerate(free) if f == 1000]
    if full:
        k = data.draw(st.integers(1, len(full)))
        after = row.copy()
        after[0, full[:k]] = 0
        expected = node_fragment(after, np.array([cpu]), np.array([0]), t)[0]
        assert terms.after_whole_gpus(k, np.array([cpu]))[0] == pytest.approx(expected)


def test_remnant_waste_table() -> None:
    w = remnant_waste_table([810, 470, 320, 650])
    assert w[1000] == 0 and w[0] == 0
    assert w[530] == 60  # one more 470
    assert w[680] == 30  # a 650
    assert w[210] == 210  # nothing common fits
    assert w[190] == 190
    assert w[360] == 40  # a 320
    assert all(0 <= w[f] <= f for f in range(1001))
