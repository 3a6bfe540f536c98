"""Live WebSockets: who may join which group (session or token), and that a batch reaches the group once."""
from __future__ import annotations

import json
import time

import pytest
from asgiref.sync import async_to_sync
from channels.testing.websocket import WebsocketCommunicator
from django.test import Client

from config.asgi import application
from inventory.models import Node
from teams.models import ApiToken
from teams.services import api_token_create
from tests.monitoring.conftest import batch, payload, post, sample

pytestmark = pytest.mark.django_db(transaction=True)


def _session_headers(user) -> list[tuple[bytes, bytes]]:
    client = Client()
    client.force_login(user)
    cookie = client.cookies["sessionid"].value
    return [(b"cookie", f"sessionid={cookie}".encode()), (b"origin", b"http://testserver")]


def _token_headers(user) -> list[tuple[bytes, bytes]]:
    _, key = api_token_create(user=user)
    return [(b"authorization", f"Token {key}".encode())]


async def _connect(path: str, headers) -> tuple[bool, WebsocketCommunicator]:
    communicator = WebsocketCommunicator(application, path, headers=headers)
    connected, _ = await communicator.connect(timeout=5)
    if connected:
        hello = json.loads(await communicator.receive_from(timeout=5))
        assert hello["type"] == "hello"
    return connected, communicator


def _can_join(path: str, headers) -> bool:
    async def run():
        connected, communicator = await _connect(path, headers)
        await communicator.disconnect()
        return connected

    return async_to_sync(run)()


def test_a_member_joins_their_pools_by_session_and_is_refused_elsewhere(world):
    headers = _session_headers(world.member)
    assert _can_join("/ws/pools/a100/", headers)
    assert not _can_join("/ws/pools/l4/", headers)  # no quota of team ml there
    assert _can_join("/ws/teams/ml/", headers)
    assert not _can_join("/ws/teams/infra/", headers)
    assert _can_join(f"/ws/nodes/{Node.objects.get(name='node-a').pk}/", headers)
    assert not _can_join(f"/ws/nodes/{Node.objects.get(name='node-c').pk}/", headers)
    assert not _can_join("/ws/pools/nope/", headers)


def test_staff_may_watch_everything(world):
    headers = _token_headers(world.staff)
    assert _can_join("/ws/pools/l4/", headers) and _can_join("/ws/teams/ml/", headers)


def test_scripts_authenticate_with_a_token_and_a_wrong_token_or_none_is_refused(world):
    assert _can_join("/ws/pools/a100/", _token_headers(world.member))
    assert not _can_join("/ws/pools/l4/", _token_headers(world.member))
    assert not _can_join("/ws/pools/a100/", [(b"authorization", b"Token not-a-real-token")])
    assert not _can_join("/ws/pools/a100/", [(b"origin", b"http://testserver")])  # anonymous browser
    # A browser from a foreign origin is refused even with a valid session.
    foreign = [h for h in _session_headers(world.member) if h[0] != b"origin"] + [(b"origin", b"http://evil.test")]
    assert not _can_join("/ws/pools/a100/", foreign)


def test_one_agent_batch_reaches_the_pool_group_as_one_typed_message(world, host):
    async def listen(communicator):
        return json.loads(await communicator.receive_from(timeout=5))

    as_member, as_staff, as_outsider = (_token_headers(u) for u in (world.member, world.staff, world.outsider))

    async def run():
        ok_member, member = await _connect("/ws/pools/a100/", as_member)
        ok_node, node = await _connect(f"/ws/nodes/{host.node.pk}/", as_staff)
        ok_other, other = await _connect("/ws/pools/l4/", as_outsider)
        assert ok_member and ok_node and ok_other
        t = time.time()
        from asgiref.sync import sync_to_async

        response = await sync_to_async(post)(host, payload(batch([sample(u, util=i) for i, u in enumerate(host.uuids)],
                                                                 t=t)))
        assert response.status_code == 200
        got = await listen(member)
        got_node = await listen(node)
        nothing_for_other = await other.receive_nothing(timeout=0.5)
        nothing_more = await member.receive_nothing(timeout=0.3)
        for c in (member, node, other):
            await c.disconnect()
        return got, got_node, nothing_for_other, nothing_more

    got, got_node, nothing_for_other, nothing_more = async_to_sync(run)()
    assert got["type"] == "telemetry.samples" and got["t"] == pytest.approx(time.time(), abs=10)
    assert sorted(s["util"] for s in got["samples"]) == [0, 1, 2, 3]
    assert {s["uuid"] for s in got["samples"]} == set(host.uuids)
    assert set(got["samples"][0]) == {"gpu", "uuid", "t", "util", "mem_util", "mem_used", "mem_total", "temp", "power",
                                      "processes"}
    assert got_node["samples"] == got["samples"]
    assert nothing_for_other and nothing_more  # l4 watchers get nothing of a100; one message per batch


@pytest.mark.parametrize("how", ["stays", "leaves_team", "token_deleted", "deactivated", "logs_out",
                                 "changes_password", "changes_password_signed_in_by_session",
                                 "is_deactivated_signed_in_by_session"])
def test_a_watcher_who_loses_access_stops_receiving_on_the_next_recheck(world, host, monkeypatch, how):
    # Access was checked at connect only: a member who left the team, was deactivated, logged out or whose
    # token was deleted kept receiving the pool's live telemetry for as long as the socket stayed open.
    from monitoring import consumers
    from teams.models import Membership

    monkeypatch.setattr(consumers, "RECHECK_SECONDS", 0)
    browser = Client()
    browser.force_login(world.member)
    session = [(b"cookie", f"sessionid={browser.cookies['sessionid'].value}".encode()),
               (b"origin", b"http://testserver")]
    headers = session if how == "logs_out" or how.endswith("by_session") else _token_headers(world.member)

    def lose_access():
        if how == "leaves_team":
            Membership.objects.filter(user=world.member).delete()
        elif how == "token_deleted":
            ApiToken.objects.filter(user=world.member).delete()
        elif how in ("deactivated", "is_deactivated_signed_in_by_session"):
            world.member.is_active = False
            world.member.save()
        elif how.startswith("changes_password"):
            world.member.set_password("a-new-and-long-password")
            world.member.save()
        elif how == "logs_out":
            browser.logout()

    async def run():
        from asgiref.sync import sync_to_async

        connected, communicator = await _connect("/ws/pools/a100/", headers)
        assert connected
        await sync_to_async(lose_access)()
        response = await sync_to_async(post)(host, payload(batch([sample(u) for u in host.uuids], t=time.time())))
        assert response.status_code == 200
        return await communicator.receive_output(timeout=5)

    output = async_to_sync(run)()
    if how == "stays":
        assert output["type"] == "websocket.send" and json.loads(output["text"])["type"] == "telemetry.samples"
    else:
        assert output == {"type": "websocket.close", "code": 4403}


@pytest.mark.parametrize("path", ["/ws/nope/", "/ws/nodes/" + "9" * 5000 + "/", "/ws/pools/", "/"])
def test_a_socket_to_no_route_is_refused_with_4404(world, path):
    headers = _token_headers(world.staff)

    async def run():
        communicator = WebsocketCommunicator(application, path, headers=headers)
        connected, code = await communicator.connect(timeout=5)
        return connected, code

    assert async_to_sync(run)() == (False, 4404)  # was: "No route found" raised in the router
