"""publish_groups (the blocking publish WSGI workers and Celery use) reaches what channels-redis' own
pub/sub layer receives, on one shard and on several."""
from __future__ import annotations

import asyncio

import pytest
from django.conf import settings

from common.channel_layer import PubSubChannelLayer

pytestmark = pytest.mark.integration


@pytest.mark.parametrize("shards", [1, 3])
def test_a_blocking_publish_arrives_through_the_layers_own_receive(shards):
    if not settings.REDIS_URL:
        pytest.fail("this test needs Redis: set REDIS_URL (make test does)")
    # Several shards on one Redis server: pub/sub ignores the database number, so each message
    # arrives only if it was published on the channel name the receiving side subscribed to.
    layer = PubSubChannelLayer(hosts=[{"address": settings.REDIS_URL}] * shards, prefix="test-blocking")
    groups = [f"pool.{i}" for i in range(6)]

    async def scenario():
        channels = {}
        for group in groups:
            channels[group] = await layer.new_channel()
            await layer.group_add(group, channels[group])
        await asyncio.to_thread(layer.publish_groups, {g: {"type": "live.message", "text": g} for g in groups})
        received = {g: await asyncio.wait_for(layer.receive(channels[g]), 5) for g in groups}
        await layer.flush()
        return received

    received = asyncio.run(scenario())
    assert received == {g: {"type": "live.message", "text": g} for g in groups}
