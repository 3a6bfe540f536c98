"""Agents' telemetry over `/ws/agent/telemetry/`: a frame is judged as the HTTP request is, frames of several
hosts are ingested together and each answered for itself, and a bad or unauthorized frame costs only itself."""
from __future__ import annotations

import asyncio
import time
from datetime import timedelta

import orjson
import pytest
from asgiref.sync import async_to_sync
from channels.testing import WebsocketCommunicator
from django.utils import timezone

from config.asgi import application
from inventory import services as inventory_services
from inventory.models import Gpu, Node
from monitoring import gather, hot, ingest
from monitoring.models import Sample
from tests.monitoring.conftest import batch, payload, sample

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def hosts(world):
    """node-a and node-b: (key, their GPUs' UUIDs, token) each."""
    out = []
    for name in ("node-a", "node-b"):
        node = Node.objects.get(name=name)
        token, key = inventory_services.host_token_create(actor=world.staff, cluster=node.cluster, host_name=name)
        out.append((key, [g.uuid for g in Gpu.objects.filter(node=node).order_by("index")], token))
    return out


def socket(key: str) -> WebsocketCommunicator:
    return WebsocketCommunicator(application, "/ws/agent/telemetry/", headers=[(b"authorization", f"Host {key}".encode())])


def test_frames_of_two_hosts_are_ingested_together_and_each_answered_for_itself(hosts, monkeypatch):
    calls = []
    many = ingest.telemetry_ingest_many
    monkeypatch.setattr(ingest, "telemetry_ingest_many", lambda deliveries, **kw: calls.append(len(deliveries))
                        or many(deliveries, **kw))
    (key_a, uuids_a, _), (key_b, uuids_b, _) = hosts
    long_ago = timezone.now() - timedelta(minutes=2)
    Node.objects.update(last_seen_at=long_ago)

    async def scenario():
        a, b = socket(key_a), socket(key_b)
        assert (await a.connect(timeout=10))[0] and (await b.connect(timeout=10))[0]
        t = time.time()
        await a.send_to(text_data=orjson.dumps(payload(batch([sample(u) for u in uuids_a], t=t, seq=3))).decode())
        await b.send_to(text_data=orjson.dumps(payload(batch([sample(uuids_b[0]), sample("GPU-nobody")], t=t,
                                                             seq=9))).decode())
        answers = await asyncio.gather(a.receive_json_from(timeout=20), b.receive_json_from(timeout=20))
        # The same frame again: acknowledged, nothing stored twice.
        await a.send_to(text_data=orjson.dumps(payload(batch([sample(u) for u in uuids_a], t=t, seq=3))).decode())
        again = await a.receive_json_from(timeout=20)
        await a.disconnect(timeout=10)
        await b.disconnect(timeout=10)
        return answers, again

    (first_a, first_b), again = async_to_sync(scenario)()
    assert first_a == {"type": "ack", "accepted": 4, "ack": 3, "rejected": {}, "clamped": {}}
    assert first_b == {"type": "ack", "accepted": 1, "ack": 9, "rejected": {"unknown_gpu": 1}, "clamped": {}}
    assert again == {"type": "ack", "accepted": 0, "ack": 3, "rejected": {"duplicate": 4}, "clamped": {}}
    assert sum(calls) == 3  # every frame ingested once (together when they arrive within GATHER_SECONDS)
    assert Sample.objects.count() == 5
    assert hot.counters(["accepted"]) == {"accepted": 5}
    # Their frames say both hosts are alive (their agents send no HTTP heartbeats meanwhile); node-c sent none.
    seen = dict(Node.objects.values_list("name", "last_seen_at"))
    assert seen["node-a"] > long_ago and seen["node-b"] > long_ago and seen["node-c"] == long_ago


def test_a_bad_frame_gets_the_http_answers_status_and_rule_and_the_socket_stays_open(hosts):
    (key_a, uuids_a, token_a), _ = hosts

    async def scenario():
        ws = socket(key_a)
        assert (await ws.connect(timeout=10))[0]
        answers = []
        for frame in ("not json", orjson.dumps({"batches": "no"}).decode(),
                      orjson.dumps(payload(batch([sample(uuids_a[0])], seq=-1))).decode(),
                      orjson.dumps(payload(batch([sample(uuids_a[0])], seq=1))).decode()):
            await ws.send_to(text_data=frame)
            answers.append(await ws.receive_json_from(timeout=20))
        await ws.disconnect(timeout=10)
        return answers

    not_json, malformed, bad_seq, good = async_to_sync(scenario)()
    assert (not_json["status"], not_json["field"], not_json["rule"]) == (400, "body", "parse_error")
    assert (malformed["status"], malformed["field"], malformed["rule"]) == (400, "batches", "malformed")
    assert (bad_seq["status"], bad_seq["field"], bad_seq["rule"]) == (400, "seq", "min_value")
    assert good["type"] == "ack" and good["accepted"] == 1
    assert Sample.objects.count() == 1


@pytest.mark.django_db
def test_one_hosts_bad_seq_refuses_only_its_own_request(hosts):
    """telemetry_ingest_many: the outcomes in order, the error for the bad request, the others stored."""
    from common.errors import ValidationFailed

    (_, uuids_a, token_a), (_, uuids_b, token_b) = hosts
    bad, good, no_stream = ingest.telemetry_ingest_many([
        (token_a, payload(batch([sample(uuids_a[0])], seq=-5))),
        (token_b, payload(batch([sample(u) for u in uuids_b], seq=2))),
        (token_a, {"stream": "", "batches": []}),
    ])
    assert isinstance(bad, ValidationFailed) and bad.errors[0].field == "seq"
    assert good.accepted == 4 and good.ack == 2
    assert isinstance(no_stream, ValidationFailed) and no_stream.errors[0].field == "stream"
    stored = set(Sample.objects.values_list("gpu_id", flat=True))
    assert stored == set(Gpu.objects.filter(uuid__in=uuids_b).values_list("pk", flat=True))


@pytest.mark.django_db
def test_the_host_maps_a_gathered_ingest_lacks_are_built_together_and_match_one_by_one(
        hosts, django_assert_max_num_queries):
    """Cold maps of every host in one ingest: two queries for all of them (their GPUs, the shares on those),
    not two per host, and the same maps host_gpus builds for each alone."""
    from django.core.cache import cache

    (_, uuids_a, token_a), (_, uuids_b, token_b) = hosts
    cache.delete_many([ingest._host_key(token_a), ingest._host_key(token_b)])
    with django_assert_max_num_queries(2):
        maps = ingest.hosts_gpus([token_a, token_b, token_a], cached={})
    assert set(maps[token_a.pk]) == set(uuids_a) and set(maps[token_b.pk]) == set(uuids_b)
    built_together = dict(maps)
    cache.delete_many([ingest._host_key(token_a), ingest._host_key(token_b)])
    assert {t.pk: ingest.host_gpus(t) for t in (token_a, token_b)} == built_together
    # Cached now: an ingest that found them reads nothing.
    cached = {ingest._host_key(t): cache.get(ingest._host_key(t)) for t in (token_a, token_b)}
    with django_assert_max_num_queries(0):
        assert ingest.hosts_gpus([token_a, token_b], cached=cached) == built_together


def test_an_unknown_or_revoked_token_is_closed_with_4401(hosts, world, monkeypatch):
    from channels.db import database_sync_to_async

    monkeypatch.setattr("monitoring.consumers.RECHECK_SECONDS", 0)  # look at the token again on every frame
    (key_a, uuids_a, token_a), _ = hosts

    async def scenario():
        unknown = socket("not-a-key")
        connected, code = await unknown.connect(timeout=10)
        assert not connected and code == 4401
        ws = socket(key_a)
        assert (await ws.connect(timeout=10))[0]
        await database_sync_to_async(inventory_services.host_token_revoke)(actor=world.staff, token=token_a)
        await ws.send_to(text_data=orjson.dumps(payload(batch([sample(uuids_a[0])], seq=1))).decode())
        return await ws.receive_output(timeout=20)

    closed = async_to_sync(scenario)()
    assert closed == {"type": "websocket.close", "code": 4401}
    assert not Sample.objects.exists()


def test_frames_waiting_together_are_one_ingest(hosts, monkeypatch):
    calls = []
    many = ingest.telemetry_ingest_many
    monkeypatch.setattr(ingest, "telemetry_ingest_many", lambda deliveries, **kw: calls.append(len(deliveries))
                        or many(deliveries, **kw))
    (_, uuids_a, token_a), (_, uuids_b, token_b) = hosts

    async def scenario():
        g = gather.Gatherer()  # both frames are waiting before its task first runs
        return await asyncio.gather(g.ingest(token_a, payload(batch([sample(uuids_a[0])], seq=1))),
                                    g.ingest(token_b, payload(batch([sample(uuids_b[0])], seq=1))))

    a, b = async_to_sync(scenario)()
    assert calls == [2] and a.accepted == b.accepted == 1 and Sample.objects.count() == 2


@pytest.mark.django_db
def test_the_gatherer_answers_every_frame_when_the_ingest_fails(monkeypatch):
    from django.db import OperationalError

    def busy(deliveries, **kw):
        raise OperationalError("database is locked")

    monkeypatch.setattr(ingest, "telemetry_ingest_many", busy)

    async def scenario():
        g = gather.Gatherer()
        return await asyncio.gather(*(g.ingest(None, {}) for _ in range(3)), return_exceptions=True)

    outcomes = async_to_sync(scenario)()
    assert all(isinstance(o, OperationalError) for o in outcomes)
    assert gather.refusal(outcomes[0])["rule"] == "busy" and gather.refusal(outcomes[0])["status"] == 503


def test_agent_sockets_open_without_the_session_stack_and_the_telemetry_socket_without_a_channel(
        hosts, monkeypatch):
    """At fleet size every socket open's work on the event loop counts: an agent's sockets need no session, no
    user and (telemetry) no channel-layer name or Redis subscription, so they get none."""
    import channels.auth
    import channels.consumer

    def no(*args, **kwargs):
        raise AssertionError("an agent socket asked for what it does not use")

    monkeypatch.setattr(channels.auth, "get_user", no)
    monkeypatch.setattr(channels.consumer, "get_channel_layer", lambda alias: None if alias is None else no())
    (key, uuids, _), _ = hosts

    async def scenario():
        telemetry = socket(key)
        assert (await telemetry.connect(timeout=10))[0]
        await telemetry.send_to(text_data=orjson.dumps(payload(batch([sample(uuids[0])], seq=1))).decode())
        answer = await telemetry.receive_json_from(timeout=20)
        await telemetry.disconnect(timeout=10)
        return answer

    assert async_to_sync(scenario)()["type"] == "ack"
