"""The API benchmarks' pure parts (CPU per call, history): summaries against their baselines and the tables."""
from __future__ import annotations

from benchmarks.api_cpu import format_table, summarize


def test_summary_gives_medians_and_the_ratio_to_healthz():
    summary = summarize({"healthz": [1.0, 2.0, 3.0], "create": [20.0, 30.0, 40.0, 1000.0],
                         "release": [10.0], "list": [4.0, 8.0]})
    assert summary["healthz"] == {"calls": 3, "cpu_ms_median": 2.0, "cpu_ms_mean": 2.0, "vs_healthz": 1.0}
    assert summary["create"]["cpu_ms_median"] == 35.0  # one slow call moves the mean, not the median
    assert summary["create"]["cpu_ms_mean"] == 272.5
    assert summary["create"]["vs_healthz"] == 17.5
    assert summary["list"]["vs_healthz"] == 3.0


def test_table_has_a_row_per_call_in_order():
    summary = summarize({"healthz": [1.0], "create": [3.0], "release": [2.0], "list": [4.0]})
    lines = format_table(summary).splitlines()
    assert [line.split()[0] for line in lines[1:]] == ["healthz", "create", "release", "list"]
    assert lines[2].split()[-1] == "3.0"


def test_worker_rows_follow_the_request_rows_when_measured():
    summary = summarize({"healthz": [2.0], "create": [6.0], "release": [4.0], "list": [8.0],
                         "activate": [10.0], "apply job": [20.0], "undo job": [22.0]})
    assert list(summary) == ["healthz", "create", "release", "list", "activate", "apply job", "undo job"]
    assert summary["apply job"]["vs_healthz"] == 10.0
    assert format_table(summary).splitlines()[-1].split()[:2] == ["undo", "job"]


def test_history_summary_compares_with_the_create_without_history():
    from benchmarks.history import format_table as history_table
    from benchmarks.history import summarize as history_summary

    summary = history_summary({"create (with history)": [30.0, 32.0, 31.0], "create (no history)": [8.0, 7.0, 9.0],
                               "held now (fleet)": [0.8]})
    assert summary["create (with history)"] == {"calls": 3, "wall_ms_median": 31.0, "vs_create_without_history": 3.88}
    assert summary["held now (fleet)"]["vs_create_without_history"] == 0.1
    assert history_table(summary).splitlines()[1].startswith("create (with history)")
