"""Staff move GPUs between pools and nodes, but not one that is booked: its reservation names the pool
and the host it was placed on."""
from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from allocations.models import Allocation
from inventory.models import Gpu, Node
from tests.allocations.test_reservation_lifecycle import URL, reserve


def _move(api, world, gpu, **body):
    return api(world.staff).patch(f"/api/v1/gpus/{gpu.pk}/", body, format="json")


@pytest.mark.parametrize("hours_from_now", [0, 24])  # running now, or booked for tomorrow
def test_a_booked_gpu_cannot_change_pool(world, api, hours_from_now):
    reserve(api(world.member), gpus=1, hours_from_now=hours_from_now)
    gpu = Allocation.objects.get().gpu
    response = _move(api, world, gpu, pool="l4", healthy=False)
    assert response.status_code == 409, response.content
    assert [(e["field"], e["rule"]) for e in response.json()["errors"]] == [("pool", "gpu_booked")]
    gpu.refresh_from_db()
    assert (gpu.pool.slug, gpu.healthy) == ("a100", True)  # nothing of the refused write


def test_a_booked_gpu_cannot_change_node(world, api):
    reserve(api(world.member), gpus=1)
    gpu = Allocation.objects.get().gpu
    response = _move(api, world, gpu, node=Node.objects.get(name="node-c").pk)
    assert response.status_code == 409
    assert response.json()["errors"][0]["rule"] == "gpu_booked"
    assert Gpu.objects.get(pk=gpu.pk).node.name == gpu.node.name


def test_a_gpu_moves_once_its_booking_is_released(world, api):
    booked = reserve(api(world.member), gpus=1)
    gpu = Allocation.objects.get().gpu
    assert api(world.member).post(f"{URL}{booked['id']}/release/").status_code == 200
    response = _move(api, world, gpu, pool="l4")
    assert response.status_code == 200, response.content
    assert Gpu.objects.get(pk=gpu.pk).pool.slug == "l4"


def test_a_free_gpu_moves_and_other_changes_of_a_booked_one_pass(world, api):
    reserve(api(world.member), gpus=1)
    booked = Allocation.objects.get().gpu
    assert _move(api, world, booked, healthy=False, pool="a100").status_code == 200
    free = Gpu.objects.filter(pool=world.pool).exclude(pk=booked.pk).first()
    assert _move(api, world, free, pool=None).status_code == 200
    assert Gpu.objects.get(pk=free.pk).pool is None


def test_a_gpu_whose_bookings_ended_moves(world, api):
    gpu = Gpu.objects.filter(pool=world.pool).first()
    reservation = reserve(api(world.member), gpus=1)
    past = timezone.now() - timedelta(hours=1)
    Allocation.objects.filter(reservation_id=reservation["id"]).update(gpu=gpu, starts_at=past - timedelta(hours=1),
                                                                       ends_at=past)
    assert _move(api, world, gpu, pool="l4").status_code == 200
