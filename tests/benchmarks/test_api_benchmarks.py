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


def _statements_of(run) -> list[str]:
    """The SQL texts (placeholders, not values) a call sends, whitespace-normalized."""
    from django.db import connection

    sent: list[str] = []

    def record(execute, sql, params, many, context):
        sent.append(" ".join(sql.split()))
        return execute(sql, params, many, context)

    with connection.execute_wrapper(record):
        run()
    return sent


def test_floor_sql_tier_sends_the_statements_the_services_send(world):
    """benchmarks.api_floor's `sql` tier claims to be what a create and a release cost the database:
    it must stay the services' statements (a change to either makes this fail)."""
    from datetime import timedelta

    from django.db import connection
    from django.utils import timezone

    from allocations import services
    from benchmarks import api_floor

    if connection.vendor != "postgresql":
        import pytest

        pytest.fail("needs PostgreSQL, as the benchmark does: run it with `make test`")
    from django.contrib.contenttypes.models import ContentType

    from allocations.models import Reservation

    ContentType.objects.get_for_model(Reservation)  # cached once a process, as in a warm web worker
    # The pool's workload profile too: read once per pool and process every profiles.PROFILE_TTL_SECONDS (one
    # query then, none on the creates in between), so not part of a create's floor.
    from allocations import profiles

    profiles.pool_profile(world.pool.pk)
    start = timezone.now() + timedelta(hours=1)
    created: list = []
    sent = _statements_of(lambda: created.append(services.reservation_create(
        actor=world.member, request=services.ReservationRequest(
            team="ml", pool="a100", gpus=2, starts_at=start, ends_at=start + timedelta(minutes=30)))))
    sent += _statements_of(lambda: services.reservation_release(actor=world.member, reservation_id=created[0].pk))
    sent += _statements_of(lambda: services.selectors.with_allocated_gpus(created))

    def normalized(statement: str) -> str:
        return " ".join(statement.split())

    floor = [api_floor.LOCK_POOL, api_floor.POOL_GPUS, api_floor.POOL_GRANTS, api_floor.TEAM_WINDOWS, api_floor.INSERT_RESERVATION,
             api_floor.INSERT_ALLOCATION, api_floor.INSERT_EVENT, api_floor.INSERT_AUDIT_ENTRY, api_floor.LOCK_RESERVATION,
             api_floor.HAS_WAITING, api_floor.WORTH_A_PASS,
             api_floor.CANCEL_ALLOCATIONS, api_floor.RELEASE_RESERVATION]
    for statement in floor:
        assert any(s.startswith(normalized(statement)) for s in sent), f"the services no longer send: {statement}\n{sent}"
    # ALLOCATED_GPUS reads one reservation's; the services' read takes a list (IN (...)).
    assert any(s.startswith(normalized(api_floor.ALLOCATED_GPUS).split(" WHERE ")[0]) for s in sent)
    # Nothing the services send is missing from the floor (savepoints aside: the test's own transaction
    # turns the services' BEGIN/COMMIT into them). INSERT_EVENT and INSERT_AUDIT_ENTRY run twice, once in each
    # transaction; ALLOCATED_GPUS once.
    assert len([s for s in sent if not s.startswith(("SAVEPOINT", "RELEASE SAVEPOINT"))]) == len(floor) + 3, sent
