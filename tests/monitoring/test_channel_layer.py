"""publish_groups (the blocking publish WSGI workers and Celery use) reaches what channels-redis' own
pub/sub layer receives, on one shard and on several."""
from __future__ import annotations

import asyncio

import pytest
from django.conf import settings

from common.channel_layer import PubSubChannelLayer
from config.settings import channel_layer_prefix
from tests.monitoring.conftest import installation_url, other_db

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


def installation_layer(redis_url: str) -> PubSubChannelLayer:
    """The channel layer a portal with this REDIS_URL builds (its settings' CONFIG)."""
    return PubSubChannelLayer(hosts=[{"address": redis_url}], prefix=channel_layer_prefix(redis_url))


def test_two_portals_on_two_databases_of_one_redis_do_not_receive_each_others_group_messages():
    """Redis pub/sub ignores the database number: with one prefix for every installation, a pool update
    sent by a portal on db 8 reached the browsers of a portal on db 9."""
    if not settings.REDIS_URL:
        pytest.fail("this test needs Redis: set REDIS_URL (make test does)")
    ours, theirs = installation_layer(settings.REDIS_URL), installation_layer(installation_url(other_db()))

    async def scenario():
        channel = await ours.new_channel()
        await ours.group_add("pool.1", channel)
        await asyncio.to_thread(theirs.publish_groups, {"pool.1": {"type": "live.message", "text": "theirs"}})
        await theirs.group_send("pool.1", {"type": "live.message", "text": "theirs, async"})
        # Redis delivers one subscriber's messages in the order it published them: if either of theirs
        # had reached us, it would come before our own.
        await asyncio.to_thread(ours.publish_groups, {"pool.1": {"type": "live.message", "text": "ours"}})
        first = await asyncio.wait_for(ours.receive(channel), 5)
        await ours.flush()
        await theirs.flush()
        return first

    assert asyncio.run(scenario()) == {"type": "live.message", "text": "ours"}


def test_the_prefix_names_the_installation_and_its_database(monkeypatch):
    import environ

    assert channel_layer_prefix("redis://redis:6379/8") == "gpupool.8."
    assert channel_layer_prefix("redis://redis:6379") == "gpupool.0."
    assert channel_layer_prefix("unix:///run/redis.sock?db=9") == "gpupool.9."
    monkeypatch.setenv("CHANNEL_LAYER_PREFIX", "east")
    assert channel_layer_prefix("redis://redis:6379/8") == "east.8."
    monkeypatch.setenv("CHANNEL_LAYER_PREFIX", "east portal")
    with pytest.raises(environ.ImproperlyConfigured, match="CHANNEL_LAYER_PREFIX"):
        channel_layer_prefix("redis://redis:6379/8")
