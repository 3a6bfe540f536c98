"""The agents' lease channel (`/ws/agent/`): leases on connect and on change, answers recorded, bad input."""
from __future__ import annotations

import asyncio

import pytest
from asgiref.sync import async_to_sync
from channels.db import database_sync_to_async
from channels.testing import WebsocketCommunicator
from django.utils import timezone

from allocations import services
from allocations.apply import jobs
from allocations.apply.backends.agent import push_leases
from allocations.models import ApplyJob, HostLeaseReport, Reservation
from common.secrets import key_digest
from config.asgi import application
from inventory import services as inventory_services
from inventory.models import HostToken, Node
from tests.allocations.test_reservation_lifecycle import reserve

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def host(world):
    node = Node.objects.get(name="node-a")
    Node.objects.filter(pk=node.pk).update(last_seen_at=timezone.now())
    _, key = inventory_services.host_token_create(actor=world.staff, cluster=node.cluster, host_name="node-a")
    return node, key


def channel(key: str) -> WebsocketCommunicator:
    return WebsocketCommunicator(application, "/ws/agent/", headers=[(b"authorization", f"Host {key}".encode())])


def test_leases_arrive_on_connect_and_on_change_and_the_answer_activates(world, api, host):
    node, key = host
    r = reserve(api(world.member), gpus=2)
    services.reservation_activate(reservation_id=r["id"])
    job = ApplyJob.objects.get(reservation_id=r["id"])

    async def scenario():
        ws = channel(key)
        connected, _ = await ws.connect()
        assert connected
        first = await ws.receive_json_from(timeout=5)  # what the host should hold now (an applying reservation)
        keys = sorted(lease["key"] for lease in first["leases"])
        assert first["type"] == "leases" and len(keys) == 2
        assert all(lease["user"] == "member" and lease["team"] == "ml" for lease in first["leases"])
        # The apply job pushes them again and waits for the answer.
        assert await database_sync(jobs.job_run)(job_id=job.pk) == "retrying"
        pushed = await ws.receive_json_from(timeout=5)
        assert sorted(lease["key"] for lease in pushed["leases"]) == keys
        await ws.send_json_to({"type": "held", "held": keys, "failed": {}, "unleased_in_use": []})
        await ws.send_json_to({"type": "held", "held": ["nonsense"]})
        error = await ws.receive_json_from(timeout=5)
        assert error["type"] == "error" and error["field"] == "held"
        await ws.disconnect()
        return keys

    from channels.db import database_sync_to_async as database_sync

    keys = async_to_sync(scenario)()
    assert sorted(HostLeaseReport.objects.get(node=node).held) == keys
    job.refresh_from_db()
    assert job.next_attempt_at <= timezone.now()  # the answer woke the waiting job
    assert jobs.job_run(job_id=job.pk) == "succeeded"
    assert Reservation.objects.get(pk=r["id"]).state == "active"


def test_a_refused_lease_fails_the_apply_with_the_hosts_reason(world, api, host):
    node, _ = host
    r = reserve(api(world.member), gpus=1)
    services.reservation_activate(reservation_id=r["id"])
    job = ApplyJob.objects.get(reservation_id=r["id"])
    uuid = Reservation.objects.get(pk=r["id"]).allocations.get().gpu.uuid
    from allocations.apply.backends.agent import host_lease_report

    host_lease_report(node=node, held=[], failed={f"{r['id']}:{uuid}": f"GPU {uuid} is not on host node-a"})
    assert jobs.job_run(job_id=job.pk) == "failed"
    reservation = Reservation.objects.get(pk=r["id"])
    assert reservation.state == "failed" and f"host node-a refused lease {r['id']}:{uuid}" in reservation.reason


def test_a_wrong_token_is_closed_and_a_push_without_listeners_is_harmless(world, host):
    async def scenario():
        ws = channel("not-a-key")
        connected, code = await ws.connect()
        return connected, code

    connected, code = async_to_sync(scenario)()
    assert not connected and code == 4401
    push_leases([host[0].pk])  # nobody listening: nothing happens, nothing raised


def test_staff_see_a_hosts_leases_refusals_and_unleased_use_on_its_page(world, host, client):
    from allocations.apply.backends.agent import host_lease_report

    node, _ = host
    host_lease_report(node=node, held=["7:GPU-aaaaaaaa-0001"], failed={"8:GPU-bbbbbbbb-0002": "GPU not on host"},
                      unleased_in_use=["GPU-cccccccc-0003"])
    client.force_login(world.staff)
    page = client.get(f"/nodes/{node.pk}/").content.decode()
    assert "7:GPU-aaaaaaaa-0001" in page and "GPU not on host" in page and "GPU-cccccccc-0003" in page
    client.force_login(world.member)  # members watch the charts, not other teams' leases
    assert "7:GPU-aaaaaaaa-0001" not in client.get(f"/nodes/{node.pk}/").content.decode()


async def _open(key: str) -> WebsocketCommunicator:
    ws = channel(key)
    connected, _ = await ws.connect(timeout=5)
    assert connected
    assert (await ws.receive_json_from(timeout=5))["type"] == "leases"
    return ws


@pytest.mark.parametrize("frame", [
    {"type": "websocket.receive", "bytes": b"\x00\x01binary"},
    {"type": "websocket.receive", "text": ""},
    {"type": "websocket.receive", "text": "[" * 100_000},  # deeper than json's recursion limit
    {"type": "websocket.receive", "text": "not json"},
    {"type": "websocket.receive", "text": "[1, 2]"},
])
def test_a_frame_that_is_not_a_json_object_gets_an_error_and_the_channel_stays_open(world, host, frame):
    # Binary, empty and too deeply nested frames used to raise in the consumer and drop the connection.
    _, key = host

    async def scenario():
        ws = await _open(key)
        await ws.send_input(frame)
        first = await ws.receive_json_from(timeout=5)
        await ws.send_json_to({"type": "nope"})  # still answering
        second = await ws.receive_json_from(timeout=5)
        await ws.disconnect()
        return first, second

    first, second = async_to_sync(scenario)()
    assert first["type"] == "error" and first["field"] == "type"
    assert second["type"] == "error"


def _closed_4401(output: dict) -> bool:
    return output["type"] == "websocket.close" and output.get("code") == 4401


@pytest.mark.parametrize("how", ["revoke", "delete_token", "delete_node"])
def test_a_token_revoked_or_deleted_or_a_host_deleted_closes_the_open_channel_at_once(world, host, how):
    # The token was checked at connect only: the channel stayed open, kept getting leases and its answers
    # were recorded (for a deleted host: an IntegrityError that dropped the connection).
    node, key = host

    def change():
        if how == "revoke":
            inventory_services.host_token_revoke(actor=world.staff, token=HostToken.objects.get())
        elif how == "delete_token":
            HostToken.objects.get().delete()
        else:
            Node.objects.filter(pk=node.pk).delete()

    async def scenario():
        ws = await _open(key)
        await database_sync_to_async(change)()
        idle = await ws.receive_output(timeout=5)  # told at once, without waiting for the agent's next message
        return idle

    assert _closed_4401(async_to_sync(scenario)())
    assert not HostLeaseReport.objects.exists()


def test_a_channel_whose_token_was_revoked_gets_no_leases_and_its_answers_are_not_recorded(world, host):
    node, key = host

    async def scenario():
        ws = await _open(key)
        # Revoked without the signal's nudge (a queryset update, as a bulk admin action does)...
        await database_sync_to_async(lambda: (HostToken.objects.update(revoked_at=timezone.now()),
                                              inventory_services.host_token_forget(instance=HostToken.objects.get())))()
        await ws.send_json_to({"type": "held", "held": []})  # ...the next message finds it
        answer = await ws.receive_output(timeout=5)
        return answer

    assert _closed_4401(async_to_sync(scenario)())
    assert not HostLeaseReport.objects.filter(node=node).exists()


def test_revoking_one_token_of_a_host_leaves_its_other_tokens_channels_open(world, host):
    node, old_key = host
    _, new_key = inventory_services.host_token_create(actor=world.staff, cluster=node.cluster, host_name="node-a")

    async def scenario():
        old, new = await _open(old_key), await _open(new_key)
        await database_sync_to_async(lambda: inventory_services.host_token_revoke(
            actor=world.staff, token=HostToken.objects.get(key_hash=key_digest(old_key))))()
        closed = await old.receive_output(timeout=5)
        quiet = await new.receive_nothing(timeout=0.5)
        await new.send_json_to({"type": "held", "held": []})
        await asyncio.sleep(0.5)
        await new.disconnect()
        return closed, quiet

    closed, quiet = async_to_sync(scenario)()
    assert _closed_4401(closed) and quiet
    assert HostLeaseReport.objects.get(node=node).held == []
