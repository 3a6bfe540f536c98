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


def _admin_change_form(gpu, **changes) -> dict:
    data = {"node": gpu.node_id, "pool": gpu.pool_id or "", "index": gpu.index, "uuid": gpu.uuid,
            "model_name": gpu.model_name, "memory_mib": gpu.memory_mib, "driver_version": gpu.driver_version,
            "cuda_version": gpu.cuda_version, "healthy": "on" if gpu.healthy else "", "_save": "Save"}
    data.update(changes)
    return {k: v for k, v in data.items() if v != ""}


def test_the_admin_cannot_move_a_booked_gpu_either(world, api):
    from django.test import Client

    from inventory.models import GpuPool

    reserve(api(world.member), gpus=1)
    gpu = Allocation.objects.get().gpu
    l4 = GpuPool.objects.get(slug="l4")
    admin = Client()
    admin.force_login(world.staff)
    # The change form.
    page = admin.post(f"/admin/inventory/gpu/{gpu.pk}/change/", _admin_change_form(gpu, pool=l4.pk))
    assert page.status_code == 200 and "it cannot change pool" in page.content.decode()
    # The list's inline edit of the pool.
    listed = admin.post("/admin/inventory/gpu/?q=" + gpu.uuid, {
        "form-TOTAL_FORMS": "1", "form-INITIAL_FORMS": "1", "form-0-id": gpu.pk, "form-0-pool": l4.pk,
        "form-0-healthy": "on", "_save": "Save"})
    assert listed.status_code == 200 and "it cannot change pool" in listed.content.decode()
    assert Gpu.objects.get(pk=gpu.pk).pool.slug == "a100"
    # A free GPU still moves from the admin.
    free = Gpu.objects.filter(pool__slug="a100").exclude(pk=gpu.pk).first()
    moved = admin.post(f"/admin/inventory/gpu/{free.pk}/change/", _admin_change_form(free, pool=l4.pk))
    assert moved.status_code == 302, moved.content.decode()[:2000]
    assert Gpu.objects.get(pk=free.pk).pool == l4
