"""Booked vs busy per pool (monitoring.selectors.pool_activity), from hand-made telemetry sent through the ingest:
the dashboard must show idle bookings and use outside the portal, not only what is allocated."""
from __future__ import annotations

import pytest
from django.test import Client

from inventory.models import GpuPool
from monitoring.selectors import pool_activity
from tests.monitoring.conftest import batch, payload, post, sample
from tests.monitoring.test_shares import proc, reserve

pytestmark = pytest.mark.django_db


def _report(host, samples):
    response = post(host, payload(batch(samples)))
    assert response.status_code == 200 and response.json()["accepted"] == len(samples), response.content


def _a100():
    (activity,) = pool_activity(GpuPool.objects.filter(slug="a100"))
    return activity


def test_it_tells_booked_and_busy_from_booked_but_idle_and_busy_without_a_booking(world, host):
    busy_booking = reserve(world, world.member, world.team, "exclusive", host.gpus[0])
    idle_booking = reserve(world, world.member, world.team, "exclusive", host.gpus[1])
    _report(host, [
        sample(host.uuids[0], util=90),
        sample(host.uuids[1], util=0, processes=[]),
        sample(host.uuids[2], util=100),  # nobody booked it: use outside the portal
        sample(host.uuids[3], util=0, processes=[]),
    ])
    a100 = _a100()
    # node-b's four GPUs sent nothing: no data, not free.
    assert (a100.capacity, a100.booked_busy, a100.booked_idle, a100.unbooked_busy, a100.free, a100.no_data) == (
        8, 1, 1, 1, 1, 4)
    assert [(g.label, g.reservation_id, g.team) for g in a100.idle_bookings] == [("node-a:1", idle_booking.pk, "ML")]
    assert [g.label for g in a100.outside_use] == ["node-a:2"]
    assert busy_booking.pk not in [g.reservation_id for g in a100.idle_bookings]


def test_a_process_alone_makes_a_gpu_busy(world, host):
    _report(host, [sample(host.uuids[0], util=0, processes=[proc(7, 2000)])])
    a100 = _a100()
    assert (a100.unbooked_busy, a100.free) == (1, 0)


def test_a_time_sliced_gpu_counts_by_its_shares_and_the_use_nobody_booked(world, host):
    world.pool.sharing_mode, world.pool.sharing_config = "time_slicing", {"replicas": 4}
    world.pool.save()
    gpu = host.gpus[0]
    reserve(world, world.member, world.team, "time_slicing", gpu, slots=[0])  # runs something
    idle = reserve(world, world.outsider, world.other_team, "time_slicing", gpu, slots=[1, 2])  # runs nothing
    _report(host, [sample(gpu.uuid, util=70, processes=[proc(1, 3000, "member"), proc(2, 500, "stranger")])])
    a100 = _a100()
    assert (a100.booked_busy, a100.booked_idle, a100.unbooked_busy, a100.free) == (0.25, 0.5, 0.25, 0)
    assert [(g.reservation_id, g.team) for g in a100.idle_bookings] == [(idle.pk, "Infra")]
    assert [g.label for g in a100.outside_use] == ["node-a:0"]


def test_without_process_data_a_shared_gpu_is_busy_or_idle_as_a_whole(world, host):
    world.pool.sharing_mode, world.pool.sharing_config = "time_slicing", {"replicas": 4}
    world.pool.save()
    reserve(world, world.member, world.team, "time_slicing", host.gpus[0], slots=[0])
    _report(host, [sample(host.uuids[0], util=80, processes=[]), sample(host.uuids[1], util=0, processes=[])])
    a100 = _a100()
    assert (a100.booked_busy, a100.booked_idle, a100.unbooked_busy, a100.free) == (0.25, 0, 0, 1.75)


def test_the_dashboard_shows_the_four_counts_per_pool(world, host):
    reserve(world, world.member, world.team, "exclusive", host.gpus[1])
    _report(host, [sample(host.uuids[1], util=0, processes=[]), sample(host.uuids[2], util=100)])
    client = Client()
    client.force_login(world.owner)
    html = client.get("/").content.decode()
    row = html.split('<tr data-pool="a100">')[1].split("</tr>")[0]
    cells = {f: row.split(f'data-f="{f}">')[1].split("<")[0] for f in
             ("free", "booked_busy", "booked_idle", "unbooked_busy", "no_data")}
    assert cells == {"free": "0", "booked_busy": "0", "booked_idle": "1", "unbooked_busy": "1", "no_data": "6"}
    assert "a100 node-a:1 (ML, 0 %)" in html.split('id="idle-gpus"')[1].split("</p>")[0]
    assert "a100 node-a:2 (100 %, 1 process)" in html.split('id="outside-gpus"')[1].split("</p>")[0]
