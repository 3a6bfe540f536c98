"""Django's PostgreSQL backend, with pooled connections checked before use only after sitting idle.

Set as the ENGINE when DATABASE_URL is PostgreSQL (portal/settings.py). psycopg_pool's own
check, which Django's CONN_HEALTH_CHECKS turns on for a pool, sends an empty query every
time a connection is taken: one more round trip in every request. On a busy machine each
round trip is also a wait for the database process to be scheduled; in the telemetry
benchmark (10,000 GPUs, 1,000 dashboards, two cores) two A/B pairs gave a sample-to-
browser p95 of 266 and 271 ms with that check and 214 and 192 ms without it.

A connection handed back less than DB_POOL_CHECK_AFTER_IDLE_SECONDS (1 s) ago was working then and is
used again as it is; one idle longer (PostgreSQL may have restarted, a firewall may have
dropped it) is checked as before and, if dead, thrown away for the next one. Under load
connections come back within milliseconds, so the busy path sends no extra query; a
quiet server checks as often as before.
"""
from __future__ import annotations

import time

import psycopg
from django.conf import settings
from django.db.backends.postgresql import base
from psycopg_pool import ConnectionPool

# Set on a psycopg connection when Django hands it back to the pool.
_RETURNED_AT = "_gpupool_returned_at"


def needs_check(connection) -> bool:
    """Whether a pooled connection has been idle long enough to be checked (DB_POOL_CHECK_AFTER_IDLE_SECONDS)."""
    returned = getattr(connection, _RETURNED_AT, None)
    return returned is None or time.monotonic() - returned > settings.DB_POOL_CHECK_AFTER_IDLE_SECONDS


class DatabaseWrapper(base.DatabaseWrapper):
    def get_new_connection(self, conn_params):
        connection = super().get_new_connection(conn_params)
        pool = self.pool
        if pool is None:
            return connection
        # At most one try per connection the pool may hold, then one it opens anew.
        for _ in range(pool.max_size):
            if not needs_check(connection):
                return connection
            try:
                ConnectionPool.check_connection(connection)
                return connection
            except psycopg.Error:
                connection.close()
                pool.putconn(connection)  # closed: the pool drops it and opens another when it needs one
                connection = super().get_new_connection(conn_params)
        return connection

    def _close(self):
        if self.pool and self.connection is not None:
            setattr(self.connection, _RETURNED_AT, time.monotonic())
        return super()._close()
