"""Pooled PostgreSQL connections: checked before use only after sitting idle (common/postgresql/base.py)."""
from __future__ import annotations

import time

import psycopg
import pytest
from django.db import connection

from common.postgresql.base import needs_check

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def fresh_pool():
    """Each test starts and ends with an empty pool: no connection it broke outlives it."""
    connection.close()
    connection.close_pool()
    yield
    connection.close()
    connection.close_pool()


def backend_pid() -> int:
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        return cursor.fetchone()[0]


def terminate_the_pools_connections() -> None:
    """What a PostgreSQL restart does to idle pooled connections (this test's database only)."""
    s = connection.settings_dict
    with psycopg.connect(host=s["HOST"], port=s["PORT"], user=s["USER"], password=s["PASSWORD"], dbname=s["NAME"],
                         autocommit=True) as admin:
        admin.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                      "WHERE datname = current_database() AND pid <> pg_backend_pid()")


def test_the_portal_runs_postgresql_through_a_pool():
    assert connection.vendor == "postgresql" and connection.pool is not None


def test_connections_postgresql_dropped_while_idle_are_replaced_before_use(settings):
    settings.DB_POOL_CHECK_AFTER_IDLE_SECONDS = 0.05
    before = backend_pid()
    connection.close()  # back to the pool
    terminate_the_pools_connections()
    time.sleep(0.1)
    assert backend_pid() != before  # checked, found dead, replaced: no error reaches the caller


def test_only_connections_idle_past_the_threshold_are_checked(settings):
    backend_pid()
    pooled = connection.connection
    connection.close()  # Django hands it back and notes when
    settings.DB_POOL_CHECK_AFTER_IDLE_SECONDS = 60
    assert not needs_check(pooled)  # back a moment ago: used as it is, no extra round trip
    settings.DB_POOL_CHECK_AFTER_IDLE_SECONDS = 0
    time.sleep(0.01)
    assert needs_check(pooled)

    class NeverHandedBack:
        pass

    assert needs_check(NeverHandedBack())  # a connection the pool just opened is checked
