"""The suite's xdist workers each have a Redis database of their own (tests/parallel.py)."""
import os
from pathlib import Path

import pytest
from django.conf import settings

from tests import parallel


def test_each_worker_moves_up_one_database_from_the_suites():
    assert parallel.worker_redis_url("redis://127.0.0.1:6379/14", "gw0") == "redis://127.0.0.1:6379/14"
    assert parallel.worker_redis_url("redis://127.0.0.1:6379/14", "gw1") == "redis://127.0.0.1:6379/15"
    assert parallel.worker_redis_url("redis://h:6379/2?health=1", "gw3") == "redis://h:6379/5?health=1"


@pytest.mark.parametrize("url, worker", [("redis://127.0.0.1:6379/14", "gw2"),  # past database 15
                                         ("redis://127.0.0.1:6379/10", "gw1")])  # the benchmarks' 11
def test_a_worker_without_a_database_of_its_own_is_refused(url, worker):
    with pytest.raises(pytest.UsageError, match="no Redis database of its own"):
        parallel.worker_redis_url(url, worker)


def test_this_process_uses_its_workers_database():
    """Run by `make test` on every worker: fails where the suite runs in xdist workers without the plugin."""
    suite = os.environ.get(parallel.SUITE_REDIS_URL, settings.REDIS_URL)
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0")
    assert settings.REDIS_URL == (parallel.worker_redis_url(suite, worker) if suite else "")


def test_each_test_file_runs_in_exactly_one_of_the_two_runs():
    for relative in ("tests/config/test_api_schema.py", "tests/allocations/test_queue.py"):
        in_workers = not parallel.left_out(relative, serial_only=False, in_worker=True)
        in_serial_run = not parallel.left_out(relative, serial_only=True, in_worker=False)
        assert in_workers != in_serial_run
    assert parallel.left_out("tests/config/test_api_schema.py", serial_only=False, in_worker=True)
    # TEST_WORKERS=0: one process, neither a worker nor the serial run, collects everything.
    assert not parallel.left_out("tests/config/test_api_schema.py", serial_only=False, in_worker=False)
    assert not parallel.left_out("tests/allocations/test_queue.py", serial_only=False, in_worker=False)


def test_every_serial_test_file_exists():
    root = Path(__file__).resolve().parents[2]
    assert all((root / relative).is_file() for relative in parallel.SERIAL_TESTS)
