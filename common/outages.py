"""Which failures mean that Redis or PostgreSQL is unreachable, and what a process remembers of it.

A request that meets such a failure is answered 503 with the rule naming the service
(`broker_unavailable`, `database_unavailable`) and Retry-After, never a 500: the API through
its exception handler, pages with a "temporarily unavailable" page (config/outages.py).
Everything else (a query the database refuses, a bug) is left alone.
"""
from __future__ import annotations

import threading
import time

import kombu.exceptions
import psycopg
import redis
from django.db import utils as db_utils

from common.errors import ServiceUnavailable, broker_unavailable, database_unavailable

# SQLSTATEs of a server that is going away or not there yet: class 08 (connection exception), admin or
# crash shutdown, "the database system is starting up".
_GONE_STATES = ("57P01", "57P02", "57P03")


# What Redis's client (the cache, the hot values) and the Celery broker raise when Redis cannot be reached.
REDIS_UNREACHABLE = (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError,
                     kombu.exceptions.OperationalError)


def database_is_gone(error: BaseException | None) -> bool:
    """Whether a psycopg error means the server cannot be reached (refused, dropped, shutting down,
    the pool timed out waiting for a connection), not that it refused one statement."""
    if isinstance(error, psycopg.InterfaceError):
        return True  # "the connection is closed"
    if not isinstance(error, psycopg.OperationalError):
        return False
    state = error.sqlstate
    return state is None or state.startswith("08") or state in _GONE_STATES


def as_service_unavailable(exc: BaseException) -> ServiceUnavailable | None:
    """The 503 a failure stands for, or None when it is not an outage."""
    if isinstance(exc, ServiceUnavailable):
        return exc
    if isinstance(exc, REDIS_UNREACHABLE):
        return broker_unavailable()
    if isinstance(exc, (db_utils.OperationalError, db_utils.InterfaceError)) and database_is_gone(exc.__cause__):
        return database_unavailable()
    if database_is_gone(exc):
        return database_unavailable()
    return None


class Outage:
    """One process's memory that a service is down, shared by its threads: a small circuit breaker.

    While the service is up every caller uses it. Once a caller finds it down, the others are
    told at once instead of each waiting for a timeout; one caller per `probe_every` seconds
    is let through to try again, and its success (or any other sign of life) ends the outage.
    """

    def __init__(self, probe_every: float) -> None:
        self.probe_every = probe_every
        self._lock = threading.Lock()
        self.down_since: float | None = None
        self._next_probe = 0.0

    @property
    def is_down(self) -> bool:
        return self.down_since is not None

    def admit(self) -> bool:
        """Whether the caller should try the service now (always while it is up; the probe's turn while down)."""
        if self.down_since is None:
            return True
        with self._lock:
            now = time.monotonic()
            if now < self._next_probe:
                return False
            self._next_probe = now + self.probe_every
            return True

    def failed(self) -> bool:
        """Note a failure; True when it starts the outage (so it is logged once, not per request)."""
        with self._lock:
            now = time.monotonic()
            self._next_probe = max(self._next_probe, now + self.probe_every)
            if self.down_since is None:
                self.down_since = now
                return True
            return False

    def recovered(self) -> bool:
        """Note a success; True when it ends an outage."""
        if self.down_since is None:
            return False
        self.down_since = None
        return True
