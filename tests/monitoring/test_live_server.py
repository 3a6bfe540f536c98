"""Against the running server (uvicorn, 2 workers, Redis channel layer): a real agent process streams
telemetry and a script's WebSocket receives it; the ingest and the socket may sit in different workers."""
from __future__ import annotations

import asyncio
import json
import subprocess
import sys

import pytest
import websockets
import websockets.exceptions

from inventory import services
from inventory.models import Node
from teams.services import api_token_create
from tests.conftest import BASE_DIR, wait_for
from tests.factories import ClusterFactory, UserFactory

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
