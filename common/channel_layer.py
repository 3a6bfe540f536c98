"""The Redis pub/sub channel layer, and the one way synchronous code sends to WebSocket groups.

WSGI workers and Celery tasks send to groups (live telemetry, "your leases changed"
nudges) from plain threads. Through the async `group_send` that needs an event loop, a
thread hop and a round trip per group: about 0.6 ms of CPU per group, 15% of a telemetry
ingest request. `PubSubChannelLayer.publish_groups` sends all of one call's groups in one
pipelined round trip per Redis shard with plain redis-py clients, in exactly the form
channels-redis' pub/sub layer publishes (`<prefix>__group__<group>`, on the shard its
consistent hash picks, with the layer's own serializer), so its receivers cannot tell
the difference. tests/monitoring/test_live_server.py checks this against a running
server; channels-redis is pinned in requirements.txt.
"""
from __future__ import annotations

import asyncio
import threading

import redis
from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from channels_redis.pubsub import RedisPubSubChannelLayer
from channels_redis.utils import _consistent_hash, decode_hosts


class PubSubChannelLayer(RedisPubSubChannelLayer):
    def __init__(self, hosts=None, prefix: str = "asgi", **kwargs) -> None:
        super().__init__(hosts=hosts, prefix=prefix, **kwargs)
        self._prefix = prefix
        self._shard_hosts = decode_hosts(hosts)
        # Shards given by address; Sentinel-managed ones are left to the async group_send.
        self.can_publish_blocking = all("address" in host for host in self._shard_hosts)
        self._clients: dict[int, redis.Redis] = {}
        self._clients_lock = threading.Lock()

    def _client(self, shard: int) -> redis.Redis:
        with self._clients_lock:
            if shard not in self._clients:
                options = dict(self._shard_hosts[shard])
                self._clients[shard] = redis.Redis.from_url(options.pop("address"), **options)
            return self._clients[shard]

    def publish_groups(self, events: dict[str, dict]) -> None:
        """Send each group its message (a dict with a `type`): one round trip per shard."""
        pipes: dict[int, redis.client.Pipeline] = {}
        for group, message in events.items():
            channel = f"{self._prefix}__group__{group}"
            shard = _consistent_hash(channel, len(self._shard_hosts))
            if shard not in pipes:
                pipes[shard] = self._client(shard).pipeline(transaction=False)
            pipes[shard].publish(channel, self.serialize(message))
        for pipe in pipes.values():
            pipe.execute()


def send_to_groups(events: dict[str, dict]) -> None:
    """Send each group its message from synchronous code, the cheapest way the configured layer allows."""
    layer = get_channel_layer()
    if layer is None:
        return
    if getattr(layer, "can_publish_blocking", False):
        layer.publish_groups(events)
    else:
        # Any other layer (the embedded in-memory one lives in the server's event loop).
        async_to_sync(_send_all)(layer, events)


async def _send_all(layer, events: dict[str, dict]) -> None:
    await asyncio.gather(*(layer.group_send(group, event) for group, event in events.items()))
