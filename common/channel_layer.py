"""The Redis pub/sub channel layer, plus a blocking `publish_groups` for code outside an event loop.

WSGI workers and Celery tasks send to WebSocket groups (live telemetry, "your leases
changed" nudges) from plain threads. Through the async `group_send` that needs an event
loop, a thread hop and a round trip per group: about 0.6 ms of CPU per group, 15% of a
telemetry ingest request. `publish_groups` sends all of one request's groups in one
pipelined round trip with a plain redis-py client, in exactly the form channels-redis'
pub/sub layer publishes (`<prefix>__group__<group>`, the layer's own serializer), so its
receivers cannot tell the difference. tests/monitoring/test_live_server.py checks this
against a running server; channels-redis is pinned in requirements.txt.
"""
from __future__ import annotations

import threading

import redis
from channels_redis.pubsub import RedisPubSubChannelLayer
from channels_redis.utils import decode_hosts


class PubSubChannelLayer(RedisPubSubChannelLayer):
    def __init__(self, hosts=None, prefix: str = "asgi", **kwargs) -> None:
        super().__init__(hosts=hosts, prefix=prefix, **kwargs)
        self._prefix = prefix
        self._hosts = decode_hosts(hosts)
        self._client: redis.Redis | None = None
        self._client_lock = threading.Lock()

    def _blocking_client(self) -> redis.Redis:
        # One shard: with several, a group's shard is chosen by hash; we run one Redis.
        if len(self._hosts) != 1 or "address" not in self._hosts[0]:
            raise NotImplementedError("publish_groups supports one Redis host given by address")
        with self._client_lock:
            if self._client is None:
                self._client = redis.Redis.from_url(self._hosts[0]["address"])
            return self._client

    def publish_groups(self, events: dict[str, dict]) -> None:
        """Send each group its message (a dict with a `type`) in one round trip."""
        pipe = self._blocking_client().pipeline(transaction=False)
        for group, message in events.items():
            pipe.publish(f"{self._prefix}__group__{group}", self.serialize(message))
        pipe.execute()
