"""The suite split over pytest-xdist workers: `make test` runs `pytest -p tests.parallel -n TEST_WORKERS`, and
this plugin gives each worker a Redis database of its own, as pytest-django already gives each its own test
database.

Without it the workers would share one Redis database: one test's `cache.clear()` or a Celery fixture's
`flushdb()` would wipe what a test on the other worker had just written, and one worker's Celery worker
process would take the other's tasks off the shared broker queue. The move has to happen before
pytest-django sets Django up (config.settings builds the cache, the channel layer and Celery's broker from
REDIS_URL when it is imported), hence a plugin's first hook and not a conftest, which pytest loads after.
"""
from __future__ import annotations

import os
from urllib.parse import urlsplit

import pytest

# Redis has 16 databases (0-15) unless configured otherwise. The benchmarks' tests run their own processes on
# 11-13 (tests/benchmarks/test_fleet_benchmark.py); `make test` runs the suite on 14, so two workers take
# 14 and 15.
REDIS_DATABASES = 16
BENCHMARK_DATABASES = range(11, 14)
# The suite's REDIS_URL as given, before a worker's move (tests/config/test_parallel.py checks the move).
SUITE_REDIS_URL = "GPUPOOL_SUITE_REDIS_URL"
# Test files that run after the workers, in one process of their own (`make test`'s second run, --serial-only):
# in an xdist worker schemathesis (4.32) runs the first of test_api_schema's operations and none of the others.
SERIAL_TESTS = frozenset({"tests/config/test_api_schema.py"})


def worker_redis_url(url: str, worker: str) -> str:
    """`url` moved to the database of xdist worker `worker` ("gw0", "gw1", ...): the suite's own for gw0,
    the next one up for gw1, and so on."""
    index = int(worker.removeprefix("gw"))
    parts = urlsplit(url)
    database = int(parts.path.strip("/") or 0) + index
    if database >= REDIS_DATABASES or (index and database in BENCHMARK_DATABASES):
        raise pytest.UsageError(f"xdist worker {worker} has no Redis database of its own above {url}: run fewer "
                                f"workers (TEST_WORKERS) or start from a lower database")
    return parts._replace(path=f"/{database}").geturl()


@pytest.hookimpl(tryfirst=True)
def pytest_load_initial_conftests(early_config, parser, args) -> None:
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    if worker and os.environ.get("REDIS_URL"):
        suite = os.environ.setdefault(SUITE_REDIS_URL, os.environ["REDIS_URL"])
        os.environ["REDIS_URL"] = worker_redis_url(suite, worker)


def pytest_addoption(parser) -> None:
    parser.addoption("--serial-only", action="store_true",
                     help="collect only the test files that must run outside xdist workers (tests.parallel.SERIAL_TESTS)")


def left_out(relative: str, *, serial_only: bool, in_worker: bool) -> bool:
    """Whether the test file at `relative` (to the root, POSIX) is left out of this run: a serial file from an
    xdist worker, every other file from the serial run. So PYTEST_ARGS that name paths or keywords go to both
    runs and each runs only its share of them, never a file twice."""
    serial = relative in SERIAL_TESTS
    return (serial and in_worker) or (not serial and serial_only)


def _relative(path, config) -> str | None:
    try:
        return path.relative_to(config.rootpath).as_posix()
    except ValueError:  # a file outside the project: not ours to sort
        return None


def pytest_ignore_collect(collection_path, config) -> bool | None:
    """Prunes what a run does not need before it is imported. pytest does not ask this hook about the paths
    named on the command line, hence pytest_collection_modifyitems too."""
    if not (collection_path.is_file() and collection_path.name.startswith("test_")):
        return None  # directories and helper modules: pytest's own rules
    relative = _relative(collection_path, config)
    if relative and left_out(relative, serial_only=config.getoption("serial_only"),
                             in_worker=hasattr(config, "workerinput")):
        return True
    return None


def pytest_collection_modifyitems(config, items) -> None:
    if not config.getoption("serial_only"):
        return  # a serial file named in a worker's run fails its own collection (see test_api_schema.py)
    kept: list = []
    dropped: list = []
    for item in items:
        (kept if _relative(item.path, config) in SERIAL_TESTS else dropped).append(item)
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = kept
