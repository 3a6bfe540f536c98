"""How the Celery processes behave when the broker (Redis) goes away.

The worker keeps running through an outage: its consumer reconnects on its own (kombu's
retry, with no limit on the number of attempts: `CELERY_BROKER_CONNECTION_MAX_RETRIES`), tasks
already running in its threads finish and write their result to the database, and what the
outage lost (messages in a Redis that went away without saving) is re-driven from the
database by the sweep (`allocations.tasks.sweep_reservations`).

One fix to kombu 5.7's Redis transport makes that true under load. When the consumer's
connection breaks, Celery 5.7 calls `Connection.collect()`, which detaches the transport
from its connection (`transport.client = None`) but can leave the default channel open (its
first close failed on the dead socket), and then `Connection.close()`, which closes that
channel again. Closing a channel that still holds unacknowledged messages (`acks_late`, and
countdown retries the worker keeps until they are due) restores them through a new Redis
client built from `transport.client`, and raises `AttributeError: 'NoneType' object has no
attribute 'hostname'`. That is no connection error, so nothing on the way catches it and the
worker stops with "Unrecoverable error". A task finishing in a thread after the break acks
its message the same way. :func:`report_a_detached_redis_channel_as_a_connection_error`
makes such a channel raise the connection error it is, which kombu and Celery already
handle on each of those paths (the close goes on, the ack is logged as impossible).
The messages stay wherever Redis kept them (its unacked index restores them after the
visibility timeout; or they are gone with a Redis that did not save), and the database is
the truth either way.
"""
from __future__ import annotations

import functools

from kombu.transport import redis as kombu_redis
from redis.exceptions import ConnectionError as RedisConnectionError


def report_a_detached_redis_channel_as_a_connection_error() -> None:
    """Make a kombu Redis channel whose transport was detached raise a connection error (idempotent)."""
    connparams = kombu_redis.Channel._connparams
    if getattr(connparams, "reports_detached_transport", False):
        return

    @functools.wraps(connparams)
    def _connparams(self, asynchronous=False):
        if self.connection is None or self.connection.client is None:
            raise RedisConnectionError("the broker connection of this channel was closed after a connection loss")
        return connparams(self, asynchronous=asynchronous)

    _connparams.reports_detached_transport = True
    kombu_redis.Channel._connparams = _connparams
