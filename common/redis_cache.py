"""Django's Redis cache backend, with one redis-py client per connection pool instead of one per call, that
degrades to a miss while Redis is unreachable.

Django's `RedisCacheClient.get_client` builds a new `redis.Redis` for every cache call, and
building one fills a table of ~170 response callbacks: about 0.4 ms of CPU per call, the
largest single cost of a telemetry ingest request (four cache calls) before this. A
redis-py client is safe to share between threads (each command takes a connection from
the pool), so one pool and one client per server serve the whole process.

What goes through the cache API is a copy of what the database holds (token and host
lookups, host maps) or a count that may start again (throttles), so while Redis is down a
read is a miss and a write is skipped: the request falls back to the database instead of
failing. The process remembers the outage (common.outages.Outage) and asks Redis again once a
second, so a Redis that does not answer costs one timeout per second, not one per call. A
delete that could not be done is logged: an entry cached before the outage lives out its
timeout. Code that needs Redis itself (the hot telemetry values, monitoring/hot.py) uses the
client and answers 503 `broker_unavailable`.
"""
from __future__ import annotations

import functools
import logging
import threading

from django.core.cache.backends.redis import RedisCache, RedisCacheClient

from common.outages import REDIS_UNREACHABLE, Outage

log = logging.getLogger(__name__)

outage = Outage(probe_every=1.0)


# One connection pool and one client per server and options, for the whole process. Django keeps a cache
# backend per thread and per asyncio context (asgiref's Local), and each backend made its own pool: in
# the WebSocket process every socket's first cache call (its token lookup) opened a Redis connection of
# its own, with its handshake. The fleet benchmark counted 1,273 connections from that one process.
_shared: dict[tuple, tuple[object, object]] = {}
_shared_lock = threading.Lock()


class _SharedClient(RedisCacheClient):
    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._by_index: dict[int, tuple[object, object]] = {}  # this backend's look-ups in `_shared`, kept

    def _get_connection_pool(self, write):
        return self._shared(write)[0]

    def get_client(self, key=None, *, write=False):
        return self._shared(write)[1]

    def _shared(self, write) -> tuple[object, object]:
        """(pool, client) of the server this call goes to, made once per process (looked up once per backend:
        every cache call comes here)."""
        index = self._get_connection_pool_index(write)
        found = self._by_index.get(index)
        if found is None:
            server = self._servers[index]
            key = (server, self._client, tuple(sorted((name, repr(value)) for name, value in self._pool_options.items())))
            with _shared_lock:
                found = _shared.get(key)
                if found is None:
                    pool = self._pool_class.from_url(server, **self._pool_options)
                    found = _shared[key] = (pool, self._client(connection_pool=pool))
            self._by_index[index] = found
        return found


def _or_while_down(fallback):
    """Run the cache call; while Redis is unreachable answer `fallback(*args)` instead."""

    def wrap(method):
        def skipped(args, kwargs):
            if method.__name__.startswith("delete"):
                log.error("cache %s not done, Redis unreachable: %r", method.__name__, args[:1])
            return fallback(*args, **kwargs)

        @functools.wraps(method)
        def call(self, *args, **kwargs):
            if not outage.admit():
                return skipped(args, kwargs)
            try:
                result = method(self, *args, **kwargs)
            except REDIS_UNREACHABLE as error:
                if outage.failed():
                    log.warning("Redis unreachable (%s); cache reads miss and writes are skipped until it answers",
                                error)
                return skipped(args, kwargs)
            if outage.recovered():
                log.warning("Redis answers again; the cache is back")
            return result

        return call

    return wrap


def _default(key, default=None, *args, **kwargs):
    return default


class SharedClientRedisCache(RedisCache):
    def __init__(self, server, params) -> None:
        super().__init__(server, params)
        self._class = _SharedClient

    get = _or_while_down(_default)(RedisCache.get)
    get_many = _or_while_down(lambda keys, *a, **k: {})(RedisCache.get_many)
    has_key = _or_while_down(lambda *a, **k: False)(RedisCache.has_key)
    set = _or_while_down(lambda *a, **k: None)(RedisCache.set)
    set_many = _or_while_down(lambda data, *a, **k: list(data))(RedisCache.set_many)
    add = _or_while_down(lambda *a, **k: False)(RedisCache.add)
    touch = _or_while_down(lambda *a, **k: False)(RedisCache.touch)
    delete = _or_while_down(lambda *a, **k: False)(RedisCache.delete)
    delete_many = _or_while_down(lambda *a, **k: None)(RedisCache.delete_many)
