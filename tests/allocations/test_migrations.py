"""The history indexes' migration: built (CONCURRENTLY on PostgreSQL, outside a transaction) and dropped again."""
from __future__ import annotations

import pytest
from django.db import connection
from django.db.migrations.executor import MigrationExecutor
from django.test.utils import CaptureQueriesContext

HISTORY_INDEXES = {
    "allocations_allocation": {"allocation_window"},
    "allocations_reservation": {"reservation_team_pool_end", "reservation_team_newest", "reservation_team_ended"},
}


def indexes_present() -> dict[str, set[str]]:
    with connection.cursor() as cursor:
        return {table: names & set(connection.introspection.get_constraints(cursor, table))
                for table, names in HISTORY_INDEXES.items()}


def migrate(targets) -> None:
    executor = MigrationExecutor(connection)
    executor.migrate(targets)


@pytest.mark.django_db(transaction=True)
def test_the_history_indexes_migrate_both_ways():
    latest = MigrationExecutor(connection).loader.graph.leaf_nodes()
    try:
        migrate([("allocations", "0004_lease_failures")])
        assert indexes_present() == {table: set() for table in HISTORY_INDEXES}
        with CaptureQueriesContext(connection) as ran:
            migrate(latest)
        assert indexes_present() == HISTORY_INDEXES
        creates = [q["sql"] for q in ran.captured_queries if q["sql"].startswith("CREATE INDEX")]
        assert len(creates) == 4
        if connection.vendor == "postgresql":  # writes go on while they build
            assert all(sql.startswith("CREATE INDEX CONCURRENTLY") for sql in creates)
    finally:
        migrate(latest)
