"""Against the running server (uvicorn, 2 workers, Redis channel layer): a real agent process streams
telemetry and a script's WebSocket receives it; the ingest and the socket may sit in different workers."""
from __future__ import annotations

import asyncio
import json
import subprocess
import sys

import httpx
import pytest
import websockets
import websockets.exceptions

from common.channel_layer import PubSubChannelLayer
from config.settings import channel_layer_prefix
from inventory import services
from inventory.models import Node
from teams.services import api_token_create
from tests.conftest import BASE_DIR, free_port, healthz_answers, start_server, stop_process_group, wait_for
from tests.factories import ClusterFactory, UserFactory
from tests.monitoring.conftest import batch, installation_url, other_db, payload, sample

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]


def test_a_real_agent_streams_to_a_websocket_client_through_redis(asgi_server, tmp_path):
    staff = UserFactory(username="root", is_staff=True)
    _, key = services.host_token_create(actor=staff, cluster=ClusterFactory(slug="lab"), host_name="sim-01")
    _, token = api_token_create(user=staff)
    log = open(tmp_path / "agent.log", "wb")
    agent = subprocess.Popen([sys.executable, "-m", "agent", "--portal", asgi_server, f"--token={key}",
                              "--simulate", "4xH100", "--hostname", "sim-01", "--state-dir", str(tmp_path),
                              "--no-lease-channel"], cwd=BASE_DIR, stdout=log, stderr=subprocess.STDOUT)
    try:
        node = wait_for(lambda: Node.objects.filter(name="sim-01").first(), message="registration")
        uuids = set(node.gpus.values_list("uuid", flat=True))

        async def listen():
            ws_url = asgi_server.replace("http", "ws") + f"/ws/nodes/{node.pk}/"
            async with websockets.connect(ws_url, additional_headers={"Authorization": f"Token {token}"}) as ws:
                assert json.loads(await asyncio.wait_for(ws.recv(), 10))["type"] == "hello"
                messages = []
                while len(messages) < 8:  # past the 5 s where a Redis read timeout once killed the socket
                    msg = json.loads(await asyncio.wait_for(ws.recv(), 15))
                    if msg["type"] == "telemetry.samples":
                        messages.append(msg)
                return messages

        messages = asyncio.run(listen())
    finally:
        agent.terminate()
        agent.wait(timeout=15)
        log.close()
    assert all({s["uuid"] for s in m["samples"]} == uuids for m in messages)
    assert all(a["t"] < b["t"] for a, b in zip(messages, messages[1:]))  # one message per batch, a second apart
    assert all(0 <= s["util"] <= 100 for m in messages for s in m["samples"])


def test_the_running_server_refuses_a_websocket_without_credentials(asgi_server, world):
    async def attempt():
        ws_url = asgi_server.replace("http", "ws") + "/ws/pools/a100/"
        with pytest.raises(websockets.exceptions.InvalidStatus) as refused:
            async with websockets.connect(ws_url, additional_headers={"Authorization": "Token wrong"}):
                pass
        return refused.value.response.status_code

    assert asyncio.run(attempt()) == 403


def _uvicorn(env: dict, log_path) -> tuple[str, object]:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    process = start_server(
        [sys.executable, "-m", "uvicorn", "config.asgi:application", "--host", "127.0.0.1", "--port", str(port),
         "--lifespan", "off", "--log-level", "warning"],
        env=env, log_path=log_path, what="uvicorn", ready=healthz_answers(url))
    return url, process


def test_a_portal_on_another_database_of_the_same_redis_never_receives_this_portals_live_messages(
        worker_env, tmp_path, world):
    """Two installations sharing one Redis server, on two database numbers: a telemetry batch sent to one
    reaches that one's sockets and not the other's. Before, both used the channel prefix `asgi` and Redis
    pub/sub, which ignores database numbers, delivered it to both."""
    theirs_redis = installation_url(other_db())
    ours, ours_process = _uvicorn(worker_env, tmp_path / "ours.log")
    theirs, theirs_process = _uvicorn(dict(worker_env, REDIS_URL=theirs_redis), tmp_path / "theirs.log")
    node = Node.objects.get(name="node-a")
    _, host_key = services.host_token_create(actor=world.staff, cluster=node.cluster, host_name=node.name)
    _, token = api_token_create(user=world.staff)
    group = f"node.{node.pk}"
    uuids = list(node.gpus.order_by("index").values_list("uuid", flat=True))

    async def scenario():
        headers = {"Authorization": f"Token {token}"}
        path = f"/ws/nodes/{node.pk}/"
        async with websockets.connect(ours.replace("http", "ws") + path, additional_headers=headers) as mine, \
                websockets.connect(theirs.replace("http", "ws") + path, additional_headers=headers) as other:
            for ws in (mine, other):
                assert json.loads(await asyncio.wait_for(ws.recv(), 10))["type"] == "hello"
            answer = await asyncio.to_thread(
                httpx.post, f"{ours}/api/v1/agent/telemetry/", headers={"Authorization": f"Host {host_key}"},
                json=payload(batch([sample(u, util=11) for u in uuids])), timeout=10)
            assert answer.status_code == 200 and answer.json()["accepted"] == 4, answer.text
            received = json.loads(await asyncio.wait_for(mine.recv(), 10))
            # The other portal's own message, published after ours: one subscriber gets Redis' messages in
            # publishing order, so had ours reached that socket it would come first.
            their_layer = PubSubChannelLayer(hosts=[{"address": theirs_redis}],
                                             prefix=channel_layer_prefix(theirs_redis))
            await asyncio.to_thread(their_layer.publish_groups,
                                    {group: {"type": "live.message", "text": json.dumps({"type": "theirs"})}})
            first_of_theirs = json.loads(await asyncio.wait_for(other.recv(), 10))
            return received, first_of_theirs

    try:
        received, first_of_theirs = asyncio.run(scenario())
    finally:
        stop_process_group(ours_process)
        stop_process_group(theirs_process)
    assert received["type"] == "telemetry.samples" and {s["util"] for s in received["samples"]} == {11}
    assert first_of_theirs == {"type": "theirs"}
