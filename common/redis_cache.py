"""Django's Redis cache backend, with one redis-py client per connection pool instead of one per call, that
degrades to a miss while Redis is unreachable.

Django's `RedisCacheClient.get_client` builds a new `redis.Redis` for every cache call, and
building one fills a table of ~170 response callbacks: about 0.4 ms of CPU per call, the
largest single cost of a telemetry ingest request (four cache calls) before this. A
redis-py client is safe to share between threads (each command takes a connection from
the pool), so one per pool is enough.

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

from django.core.cache.backends.redis import RedisCache, RedisCacheClient

from common.outages import REDIS_UNREACHABLE, Outage

log = logging.getLogger(__name__)

outage = Outage(probe_every=1.0)


class _SharedClient(RedisCacheClient):
    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._clients: dict[int, object] = {}

    def get_client(self, key=None, *, write=False):
        pool = self._get_connection_pool(write)
        client = self._clients.get(id(pool))
        if client is None:
            client = self._clients[id(pool)] = self._client(connection_pool=pool)
        return client


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
