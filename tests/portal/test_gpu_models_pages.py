"""The reserve form asks which GPU models a request accepts where the pool has more than one, and the
reservation's page and lists show the restriction (pool `mixed`: tests/allocations/test_gpu_models.py)."""
from __future__ import annotations

from datetime import timedelta

from django.test import Client
from django.utils import timezone

from allocations.models import Reservation
from tests.allocations.test_gpu_models import A100, H100, mixed  # noqa: F401 - the fixture


def signed_in(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


def local(dt) -> str:
    return timezone.localtime(dt).strftime("%Y-%m-%dT%H:%M")


def test_the_reserve_form_offers_the_models_of_a_pool_that_has_several(world, mixed):
    page = signed_in(world.member).get("/reserve/?pool=mixed").content.decode()
    assert 'id="gpu-models"' in page
    assert f'value="{H100}"' in page and f'value="{A100}"' in page and "(2 GE a GPU)" in page and "(1 GE a GPU)" in page
    # The fields swapped in when the pool changes carry it too; a pool of one model has nothing to choose.
    assert 'id="gpu-models"' in signed_in(world.member).get("/reserve/fields/?pool=mixed").content.decode()
    assert 'id="gpu-models"' not in signed_in(world.member).get("/reserve/?pool=a100").content.decode()


def test_the_form_books_only_the_models_ticked_and_the_pages_show_it(world, mixed):
    client = signed_in(world.member)
    response = client.post("/reserve/", {"team": "ml", "pool": "mixed", "gpus": 2, "gpu_models": [H100],
                                         "when": "window", "ends_at": local(timezone.now() + timedelta(hours=3))})
    assert response.status_code == 302, response.content.decode()[:2000]
    reservation = Reservation.objects.get()
    assert reservation.gpu_models == [H100]
    assert set(reservation.allocations.values_list("gpu__model_name", flat=True)) == {H100}
    detail = client.get(f"/reservations/{reservation.pk}/").content.decode()
    assert 'id="gpu-models"' in detail and H100 in detail.split('id="gpu-models"')[1][:200]
    listed = client.get("/reservations/").content.decode()
    assert f"only {H100}" in listed


def test_no_model_ticked_means_any_and_the_detail_says_so(world, mixed):
    client = signed_in(world.member)
    response = client.post("/reserve/", {"team": "ml", "pool": "mixed", "gpus": 1, "when": "window",
                                         "ends_at": local(timezone.now() + timedelta(hours=3))})
    assert response.status_code == 302
    reservation = Reservation.objects.get()
    assert reservation.gpu_models == []
    assert "any model of the pool" in client.get(f"/reservations/{reservation.pk}/").content.decode()
    assert "only " not in client.get("/reservations/").content.decode().split("<table")[1]


def test_a_refusal_on_the_models_is_shown_and_its_alternatives_keep_them(world, mixed):
    client = signed_in(world.member)
    end = local(timezone.now() + timedelta(hours=3))
    ok = client.post("/reserve/", {"team": "ml", "pool": "mixed", "gpus": 4, "gpu_models": [H100], "when": "window",
                                   "ends_at": end})
    assert ok.status_code == 302
    refused = client.post("/reserve/", {"team": "ml", "pool": "mixed", "gpus": 1, "gpu_models": [H100],
                                        "when": "window", "ends_at": end})
    assert refused.status_code == 400
    page = refused.content.decode()
    assert "Counting only GPUs of the models it accepts" in page
    offers = page.split('id="alternatives"')[1]
    assert f'name="gpu_models" value="{H100}"' in offers
