"""Edges of booking found in review: cancelled bookings, extensions after a failover, dead nodes,
extensions on broken or drained GPUs, a release after the window ended, and inputs at the end of
the calendar or of the integers (each answered, never a 500)."""
from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from allocations import selectors
from allocations.failover import node_failover
from allocations import services
from allocations.models import Allocation, Quota, Reservation
from inventory.models import Gpu, Node
from tests.allocations.test_reservation_lifecycle import URL, reserve, run_open_jobs, states
from tests.factories import add_node


def later(hours: float) -> str:
    return (timezone.now() + timedelta(hours=hours)).isoformat()


def test_a_cancelled_booking_blocks_nobody(world, api):
    # infra books the whole pool for [+2 h, +4 h) and cancels before it starts: its GPUs keep an empty window.
    cancelled = reserve(api(world.outsider), team="infra", gpus=8, hours_from_now=2, hours=2)
    assert api(world.outsider).post(f"{URL}{cancelled['id']}/release/").status_code == 200
    now = timezone.now()
    [slot] = selectors.pool_availability(world.pool, now + timedelta(hours=1), now + timedelta(hours=5),
                                         timedelta(hours=4))
    assert (slot.free, slot.free_on_one_node) == (8, 4)
    created = api(world.member).post(URL, {"pool": "a100", "team": "ml", "gpus": 4, "starts_at": later(1),
                                           "ends_at": later(5)}, format="json")
    assert created.status_code == 201, created.content


def test_an_extension_runs_past_a_cancelled_booking(world, api):
    running = reserve(api(world.outsider), team="infra", gpus=8, hours=2)
    cancelled = reserve(api(world.member), gpus=4, hours_from_now=3, hours=1)
    assert api(world.member).post(f"{URL}{cancelled['id']}/release/").status_code == 200
    extended = api(world.outsider).post(f"{URL}{running['id']}/extend/", {"ends_at": later(5)}, format="json")
    assert extended.status_code == 200, extended.content


def fail_over(reservation_id: int) -> int:
    """Kill the node the reservation is on, move it, bring the node back; returns the old node's id."""
    node_id = Allocation.objects.filter(reservation_id=reservation_id).values_list("gpu__node_id", flat=True)[0]
    Node.objects.filter(pk=node_id).update(healthy=False)
    assert node_failover(node_id=node_id)["moved"] == [reservation_id]
    Node.objects.filter(pk=node_id).update(healthy=True)
    return node_id


def test_after_a_failover_an_extension_counts_the_gpus_held_now(world, api):
    moved = reserve(api(world.member), gpus=2, hours=2)
    fail_over(moved["id"])
    reserve(api(world.member), gpus=2, hours=4)
    Quota.objects.filter(team=world.team, pool=world.pool).update(max_ge=4)  # ml holds exactly 4
    extended = api(world.member).post(f"{URL}{moved['id']}/extend/", {"ends_at": later(3)}, format="json")
    assert extended.status_code == 200, extended.content


def test_after_a_failover_an_extension_ignores_the_gpus_it_left(world, api):
    moved = reserve(api(world.member), gpus=4, hours=2)
    old_node = fail_over(moved["id"])
    later_booking = reserve(api(world.outsider), team="infra", gpus=4, hours_from_now=2.01, hours=1)
    assert set(Allocation.objects.filter(reservation_id=later_booking["id"])
               .values_list("gpu__node_id", flat=True)) == {old_node}
    extended = api(world.member).post(f"{URL}{moved['id']}/extend/", {"ends_at": later(4)}, format="json")
    assert extended.status_code == 200, extended.content


def test_a_dead_node_does_not_force_a_request_onto_one_node(world, api):
    dead = add_node(world.pool, "node-big", 8)
    Gpu.objects.filter(node=dead).update(healthy=False)
    created = api(world.member).post(URL, {"pool": "a100", "team": "ml", "gpus": 6, "ends_at": later(2)},
                                     format="json")
    assert created.status_code == 201, created.content  # 4 + 2 over the two live nodes, as availability says
    assert len({gpu["node"] for gpu in created.json()["allocated_gpus"]}) == 2


@pytest.mark.parametrize("query, field", [
    ("start=9999-12-31T12:00:00Z", "start"),
    ("start=8999-12-30T00:00:00Z&end=9999-12-31T00:00:00Z&slot=604800", "end"),
])
def test_availability_at_the_end_of_the_calendar_is_a_400(world, api, query, field):
    answer = api(world.member).get(f"/api/v1/pools/a100/availability/?{query}")
    assert answer.status_code == 400
    assert [(e["field"], e["rule"]) for e in answer.json()["errors"]] == [(field, "max_value")]


@pytest.mark.parametrize("action", ["release", "extend"])
@pytest.mark.parametrize("reservation_id", ["99999999999999999999", "0", "-3"])
def test_an_id_no_reservation_can_have_is_a_404(world, api, action, reservation_id):
    answer = api(world.member).post(f"{URL}{reservation_id}/{action}/", {"ends_at": later(3)}, format="json")
    assert answer.status_code == 404


@pytest.mark.parametrize("breakage, why", [
    ("gpu", "is unhealthy"), ("node", "is on an unhealthy node"), ("drain", "is on a node drained for new bookings"),
])
def test_an_extension_is_refused_on_a_gpu_placement_would_not_use(world, api, breakage, why):
    client = api(world.member)
    r = reserve(client, gpus=2, hours=2)
    gpu = Gpu.objects.select_related("node").get(uuid=r["allocated_gpus"][1]["uuid"])
    if breakage == "gpu":
        Gpu.objects.filter(pk=gpu.pk).update(healthy=False)
    else:
        Node.objects.filter(pk=gpu.node_id).update(**({"healthy": False} if breakage == "node" else
                                                      {"schedulable": False}))
    response = client.post(f"{URL}{r['id']}/extend/", {"ends_at": later(5)}, format="json")
    assert response.status_code == 409, response.content
    error = response.json()["errors"][0]
    assert (error["field"], error["rule"]) == ("ends_at", "gpus_unusable")
    named = gpu.uuid if breakage == "gpu" else r["allocated_gpus"][0]["uuid"]  # the first on the node
    assert named in error["message"] and why in error["message"]
    # Nothing written: the reservation and its allocations keep their end.
    assert Reservation.objects.get(pk=r["id"]).ends_at.isoformat().replace("+00:00", "Z") == r["ends_at"]
    assert set(Allocation.objects.filter(reservation_id=r["id"]).values_list("ends_at", flat=True)) == {
        Reservation.objects.get(pk=r["id"]).ends_at}


def test_an_extension_is_allowed_once_a_failover_moved_it_to_healthy_gpus(world, api):
    client = api(world.member)
    r = reserve(client, gpus=2, hours=2)
    # Its node dies and stays dead; the failover moves it to the other node.
    node_id = Allocation.objects.filter(reservation_id=r["id"]).values_list("gpu__node_id", flat=True)[0]
    Node.objects.filter(pk=node_id).update(healthy=False)
    assert node_failover(node_id=node_id)["moved"] == [r["id"]]
    response = client.post(f"{URL}{r['id']}/extend/", {"ends_at": later(3)}, format="json")
    assert response.status_code == 200, response.content


def test_a_release_after_the_window_ended_expires_the_reservation(world, api):
    client = api(world.member)
    r = reserve(client, gpus=2, hours=2)
    services.reservation_activate(reservation_id=r["id"])
    run_open_jobs()
    # Its window ends; the sweep has not run yet when the member presses release.
    ended = timezone.now() - timedelta(minutes=1)
    began = ended - timedelta(hours=2)
    Reservation.objects.filter(pk=r["id"]).update(starts_at=began, ends_at=ended)
    Allocation.objects.filter(reservation_id=r["id"]).update(starts_at=began, ends_at=ended)
    response = client.post(f"{URL}{r['id']}/release/")
    assert response.status_code == 200, response.content
    assert response.json()["state"] == "releasing"
    assert run_open_jobs() == ["succeeded"]
    reservation = Reservation.objects.get(pk=r["id"])
    assert reservation.state == Reservation.State.EXPIRED, reservation.reason
    assert "Released early" not in reservation.reason
    assert states(r["id"])[-2:] == [("active", "releasing"), ("releasing", "expired")]
    # The allocations keep the window they were held for.
    assert set(Allocation.objects.filter(reservation_id=r["id"]).values_list("ends_at", flat=True)) == {ended}
