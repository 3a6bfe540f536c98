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


def book_h100s_now(client, gpus: int) -> None:
    response = client.post("/reserve/", {"team": "ml", "pool": "mixed", "gpus": gpus, "gpu_models": [H100],
                                         "when": "window", "ends_at": local(timezone.now() + timedelta(hours=30))})
    assert response.status_code == 302, response.content.decode()[:2000]


def first_slot_free(page: str) -> str:
    return page.split('class="slot"')[1].split('data-free="')[1].split('"')[0]


def test_the_timeline_counts_only_the_models_ticked(world, mixed):
    client = signed_in(world.member)
    book_h100s_now(client, 3)  # of 4 H100s (and 4 A100s)
    base = "/reserve/availability/?pool=mixed&team=ml&gpus=1"
    h100 = client.get(f"{base}&gpu_models={H100}").content.decode()
    assert first_slot_free(h100) == "1" and "4 GPUs when nothing is booked." in h100
    a100 = client.get(f"{base}&gpu_models={A100}").content.decode()
    assert first_slot_free(a100) == "4" and "4 GPUs when nothing is booked." in a100
    both = client.get(f"{base}&gpu_models={H100}&gpu_models={A100}").content.decode()
    anything = client.get(base).content.decode()
    assert first_slot_free(both) == first_slot_free(anything) == "5" and "8 GPUs when nothing is booked." in anything
    # The range links keep the models, one parameter each.
    ranges = h100.split('<nav class="ranges">')[1].split("</nav>")[0]
    assert ranges.count("&amp;gpu_models=NVIDIA+H100+80GB+HBM3&amp;") == 3


def test_the_reserve_page_counts_the_models_in_the_address_or_the_post(world, mixed):
    client = signed_in(world.member)
    book_h100s_now(client, 3)
    page = client.get(f"/reserve/?pool=mixed&gpu_models={H100}").content.decode()
    box = page.split(f'value="{H100}"')[1].split(">")[0]
    assert "checked" in box and 'data-ge="2.0"' in box
    assert first_slot_free(page) == "1"
    refused = client.post("/reserve/", {"team": "ml", "pool": "mixed", "gpus": 2, "gpu_models": [A100],
                                        "when": "window", "ends_at": "bad"})
    assert refused.status_code == 400 and first_slot_free(refused.content.decode()) == "4"


def test_a_bad_model_in_the_timeline_query_says_why_instead_of_counting_every_model(world, mixed):
    page = signed_in(world.member).get("/reserve/availability/?pool=mixed&gpu_models=NVIDIA+L4").content.decode()
    assert 'id="availability-error"' in page and "has no GPU of model NVIDIA L4" in page
    twice = signed_in(world.member).get(
        f"/reserve/availability/?pool=mixed&gpu_models={H100}&gpu_models={H100}").content.decode()
    assert 'id="availability-error"' in twice and "twice" in twice


def test_the_ge_a_card_costs_is_the_heaviest_of_the_models_ticked(world, mixed):
    client = signed_in(world.member)

    def ge_shown(page: str) -> str:
        return page.split('data-ge-per-card="1.0">')[1].split("<")[0]

    assert ge_shown(client.get("/reserve/?pool=mixed").content.decode()) == "2"  # none ticked: the H100's
    assert ge_shown(client.get(f"/reserve/?pool=mixed&gpu_models={A100}").content.decode()) == "1"
    posted = client.post("/reserve/", {"team": "ml", "pool": "mixed", "gpus": 1, "gpu_models": [A100],
                                       "when": "window", "ends_at": "bad"})
    assert ge_shown(posted.content.decode()) == "1"
    both = client.get(f"/reserve/?pool=mixed&gpu_models={A100}&gpu_models={H100}").content.decode()
    assert ge_shown(both) == "2"
