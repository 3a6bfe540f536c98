"""The profile-guard benchmark at a tiny size: both decisions timed, the first with each new profile the dearer."""
from __future__ import annotations

import json

from benchmarks import profile_guard


def test_a_tiny_run_times_first_and_warm_decisions(tmp_path):
    out = tmp_path / "guard.json"
    result = profile_guard.main(["--nodes", "10", "--profiles", "2", "--json", str(out)])
    assert json.loads(out.read_text()) == result
    assert result["gpus"] == 80 and len(result["first_decision_cpu_ms"]) == len(result["warm_decision_cpu_ms"]) == 2
    assert result["first_median_ms"] > result["warm_median_ms"] > 0
