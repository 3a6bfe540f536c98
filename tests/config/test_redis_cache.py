"""The Redis cache backend (common/redis_cache.py) shares one connection pool per process."""
from __future__ import annotations

import pytest
import redis
from django.conf import settings

from common.redis_cache import SharedClientRedisCache


def test_every_backend_instance_shares_the_process_pool_not_one_redis_connection_each():
    """Django keeps a cache backend per thread and per asyncio context, so the WebSocket process had one per
    socket, and each opened its own Redis connection (1,273 from one process in the fleet benchmark). Fifty
    backends, as fifty sockets had, now use one connection between them."""
    if not settings.REDIS_URL:
        pytest.fail("this test needs Redis: set REDIS_URL (make test does)")
    server = redis.Redis.from_url(settings.REDIS_URL)
    backends = [SharedClientRedisCache(settings.REDIS_URL, {}) for _ in range(50)]
    backends[0].get("test-redis-cache-shared")  # the process's pool and its first connection, if not made yet
    before = server.info("clients")["connected_clients"]
    for backend in backends:
        backend.set("test-redis-cache-shared", 1, 10)
        assert backend.get("test-redis-cache-shared") == 1
    assert server.info("clients")["connected_clients"] == before
    assert len({id(backend._cache.get_client()) for backend in backends}) == 1
