"""The workload variants the portal policy's constants are chosen and checked on (benchmarks.placement_variants)."""

from __future__ import annotations

import numpy as np
import pytest

from benchmarks.placement import print_comparison
from benchmarks.placement_trace import DEFAULT_NODES, DEFAULT_TRACE, load_nodes, load_trace
from benchmarks.placement_variants import LEVELS, describe, make_variant, variants


@pytest.fixture(scope="module")
def base():
    if not DEFAULT_TRACE.exists():
        pytest.fail(f"the Alibaba trace is missing at {DEFAULT_TRACE}: check out ../shared beside the repository")
    return load_trace(DEFAULT_TRACE)


def test_training_and_heldout_never_share_a_level() -> None:
    train = {v.name for v in variants("train")}
    held = {v.name for v in variants("heldout")}
    assert train and held and not train & held
    for _, t, h in LEVELS:
        assert 5 <= len(t) + len(h) <= 6


def test_a_name_always_means_the_same_tasks(base) -> None:
    a, b = make_variant("gpushare35", base), make_variant("gpushare35", base)
    assert np.array_equal(a.cpu_milli, b.cpu_milli) and a.gpu_spec == b.gpu_spec


@pytest.mark.parametrize("name", ["gpushare20", "gpushare65", "multigpu40", "cpuheavy80"])
def test_resampled_variants_hit_their_share_and_keep_the_request(base, name: str) -> None:
    trace = make_variant(name, base)
    d = describe(trace)
    level = int("".join(c for c in name if c.isdigit()))
    key = {"gpushare": "sharing_pct_of_request", "multigpu": "multigpu_pct_of_request"}.get(name.rstrip("0123456789"))
    if key:
        assert d[key] == pytest.approx(level, abs=1.0)
    else:
        heavy = trace.cpu_milli > 11.4 * trace.gpu_request
        share = 100 * trace.gpu_request[heavy & (trace.num_gpu > 0)].sum() / trace.gpu_request.sum()
        assert share == pytest.approx(level, abs=1.0)
    assert d["gpu_request_gpus"] == pytest.approx(describe(base)["gpu_request_gpus"], rel=0.01)
    assert int((trace.num_gpu == 0).sum()) == int((base.num_gpu == 0).sum())  # CPU-only tasks kept


def test_pinned_tasks_only_get_models_they_fit_on(base) -> None:
    trace = make_variant("gpuspec50", base)
    nodes = load_nodes(DEFAULT_NODES)
    gpu = trace.num_gpu > 0
    pinned = [i for i in range(len(trace)) if trace.gpu_spec[i]]
    assert len(pinned) == pytest.approx(0.5 * gpu.sum(), abs=2)
    for i in pinned[::25]:
        models = trace.gpu_spec[i].split("|")
        assert 1 <= len(models) <= 2
        ok = [
            nodes.models[int(nodes.model_idx[n])] in models
            and nodes.cpu_cap[n] >= trace.cpu_milli[i]
            and nodes.mem_cap[n] >= trace.memory_mib[i]
            and nodes.gpu_count[n] >= trace.num_gpu[i]
            for n in range(nodes.n_nodes)
        ]
        assert any(ok)


def test_comparison_table_counts_wins_and_names_the_worst(capsys) -> None:
    def entry(ours: dict[str, float], base: dict[str, float]) -> dict:
        def pol(x):
            return {
                **{f"unallocated_pct_at_{p}": x[str(p)] for p in (90, 100, 130)},
                "per_seed_unallocated_pct_at_100": {"1": x["100"], "2": x["100"] - 1},
            }

        return {"split": "heldout", "policies": {"portal": pol(ours), "fgd": pol(base)}}

    table = print_comparison(
        {
            "a": entry({"90": 10, "100": 4, "130": 4}, {"90": 10, "100": 5, "130": 5}),
            "b": entry({"90": 10, "100": 6, "130": 4}, {"90": 10, "100": 5, "130": 5}),
        },
        "portal",
        "fgd",
        [1, 2],
    )
    assert table["a"]["ratio_at_100"] == pytest.approx(0.8) and table["a"]["seeds_won_at_100"] == 2
    assert table["b"]["seeds_won_at_100"] == 0
    assert "worst ratio at 100%: 1.200 (b)" in capsys.readouterr().out
