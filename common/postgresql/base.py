"""Django's PostgreSQL backend, with pooled connections checked before use only after sitting idle.

Set as the ENGINE when DATABASE_URL is PostgreSQL (config/settings.py). psycopg_pool's own
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

When PostgreSQL goes away, a request waiting for a connection would wait the pool's whole
timeout (DB_POOL_TIMEOUT_SECONDS, 10 s) and fail, and so would every request after it. The
process remembers instead (common.outages.Outage): a failed connection attempt of the pool, or
a request that got none, marks the database down; from then on requests are refused at once
(DatabaseUnavailable, answered 503 `database_unavailable`), except one per PROBE_EVERY
seconds that tries again with a short wait. Any connection made ends the outage. The pool
gives up a reconnection after RECONNECT_TIMEOUT (not psycopg_pool's five minutes of growing
backoff), so the next request's attempt reaches a database that is back at once.
"""
from __future__ import annotations

import time

import psycopg
from django.conf import settings
from django.db.backends.postgresql import base
from psycopg_pool import ConnectionPool, PoolTimeout

from common.outages import Outage, database_is_gone

# Set on a psycopg connection when Django hands it back to the pool.
_RETURNED_AT = "_gpupool_returned_at"


# While the database is down, one request per PROBE_EVERY seconds (per process) tries again, waiting
# at most PROBE_TIMEOUT for a connection; a request that finds it down while it waits stops
# waiting within WAIT_SLICE.
PROBE_EVERY = 1.0
PROBE_TIMEOUT = 1.0
WAIT_SLICE = 0.25
# How long the pool keeps retrying one connection (with backoff) before it gives up; the next
# request that needs a connection starts a new attempt at once.
RECONNECT_TIMEOUT = 2.0

outage = Outage(probe_every=PROBE_EVERY)


class DatabaseUnavailable(psycopg.OperationalError):
    """No connection: the database is known to be down (Django raises it as its OperationalError)."""


class WatchedConnection(psycopg.Connection):
    """The pool's connection class: every connection attempt tells the process whether the database is there."""

    @classmethod
    def connect(cls, *args, **kwargs):
        try:
            connection = super().connect(*args, **kwargs)
        except psycopg.OperationalError as error:
            if database_is_gone(error):
                outage.failed()
            raise
        outage.recovered()
        return connection


def take_connection(pool: ConnectionPool):
    """A connection from the pool, or DatabaseUnavailable as soon as the database is known to be down."""
    if not outage.admit():
        raise DatabaseUnavailable("the database is unreachable (known for a moment; not waiting for the pool)")
    pool.open()
    probing = outage.is_down
    timeout = PROBE_TIMEOUT if probing else pool.timeout
    deadline = time.monotonic() + timeout
    while True:
        try:
            connection = pool.getconn(min(WAIT_SLICE, max(0.0, deadline - time.monotonic())))
        except PoolTimeout:
            if time.monotonic() >= deadline:
                outage.failed()
                raise
            if outage.is_down and not probing:
                raise DatabaseUnavailable("the database is unreachable (the pool could not connect)") from None
            continue
        outage.recovered()
        return connection


def needs_check(connection) -> bool:
    """Whether a pooled connection has been idle long enough to be checked (DB_POOL_CHECK_AFTER_IDLE_SECONDS)."""
    returned = getattr(connection, _RETURNED_AT, None)
    return returned is None or time.monotonic() - returned > settings.DB_POOL_CHECK_AFTER_IDLE_SECONDS


class DatabaseWrapper(base.DatabaseWrapper):
    def __init__(self, settings_dict, *args, **kwargs) -> None:
        pool_options = settings_dict.get("OPTIONS", {}).get("pool")
        if isinstance(pool_options, dict):
            pool_options.setdefault("connection_class", WatchedConnection)
            pool_options.setdefault("reconnect_timeout", RECONNECT_TIMEOUT)
        super().__init__(settings_dict, *args, **kwargs)

    def get_new_connection(self, conn_params):
        pool = self.pool
        if pool is None or "isolation_level" in self.settings_dict["OPTIONS"]:
            return super().get_new_connection(conn_params)
        # Django's pooled branch, taking the connection through the outage memory.
        self.isolation_level = base.IsolationLevel.READ_COMMITTED
        connection = take_connection(pool)
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
                connection = take_connection(pool)
        return connection

    def _close(self):
        if self.pool and self.connection is not None:
            setattr(self.connection, _RETURNED_AT, time.monotonic())
        return super()._close()
