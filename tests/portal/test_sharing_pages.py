"""The pages in each sharing mode: the reserve form asks in the pool's unit, refusals sit next to the field,
the pool page splits each GPU among its holders, and the reservation pages say what was booked."""
from __future__ import annotations

from datetime import timedelta

import pytest
from django.test import Client
from django.utils import timezone

from allocations.models import Reservation
from tests.factories import (
    ClusterFactory,
    GpuFactory,
    MembershipFactory,
    NodeFactory,
    PoolFactory,
    QuotaFactory,
    TeamFactory,
    UserFactory,
)

A100 = "NVIDIA A100-SXM4-80GB"


@pytest.fixture
def fleet(db):
    team, other = TeamFactory(slug="vision", name="Vision"), TeamFactory(slug="nlp", name="NLP")
    cluster = ClusterFactory(slug="lab")
    pools = {}
    for slug, mode, config in (("mig", "mig", {"mig_layout": "all-1g.10gb"}),
                               ("ts", "time_slicing", {"replicas": 4}), ("mps", "mps", {"replicas": 4}),
                               ("hami", "vgpu", {"default_memory_mib": 20480, "default_cores_pct": 30}),
                               ("whole", "exclusive", {})):
        pool = pools[slug] = PoolFactory(slug=slug, name=slug.upper(), sharing_mode=mode, sharing_config=config)
        node = NodeFactory(cluster=cluster, name=f"{slug}-node")
        GpuFactory(node=node, pool=pool, index=0, model_name=A100, memory_mib=81920)
        QuotaFactory(team=team, pool=pool, max_ge=4)
        QuotaFactory(team=other, pool=pool, max_ge=4)
    member, stranger = UserFactory(username="sam"), UserFactory(username="ned")
    MembershipFactory(user=member, team=team)
    MembershipFactory(user=stranger, team=other)
    return {"member": member, "stranger": stranger, **pools}


def client_for(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


def ends() -> str:
    return timezone.localtime(timezone.now() + timedelta(hours=2)).strftime("%Y-%m-%dT%H:%M")


@pytest.mark.parametrize("pool, present, words", [
    ("mig", ['name="mig_profile"', 'value="1g.10gb"', 'name="count"'], "hardware-isolated"),
    ("ts", ['name="shares"', "Shares (of 4 per GPU)", 'max="4"'], "no memory isolation"),
    ("mps", ['name="shares"'], "capped at 1/4 of the SMs and of the memory (20 GiB per share)"),
    ("hami", ['name="gpu_memory_mib"', 'value="20480"', 'name="gpu_memory_pct"', 'name="gpu_cores_pct"',
              'name="gpus"'], "HAMi"),
    ("whole", ['name="gpus"'], "Whole GPUs"),
])
def test_the_reserve_form_asks_in_the_pools_unit(fleet, pool, present, words):
    page = client_for(fleet["member"]).get(f"/reserve/?pool={pool}").content.decode()
    for text in present:
        assert text in page, text
    assert words in page
    assert "not bookable" not in page and "disabled" not in page
    fields = client_for(fleet["member"]).get(f"/reserve/fields/?pool={pool}").content.decode()
    assert present[0] in fields and 'id="availability" hx-swap-oob="true"' in fields


def test_the_timeline_counts_the_shape_chosen(fleet):
    client = client_for(fleet["member"])
    page = client.get("/reserve/availability/?pool=mig&mig_profile=1g.10gb&count=2").content.decode()
    assert "When MIG has free 1g.10gb instances" in page and page.count('data-free="7"') == 24
    shares = client.get("/reserve/availability/?pool=ts&shares=3").content.decode()
    assert "free shares" in shares and "4 shares when nothing is booked" in shares
    bad = client.get("/reserve/availability/?pool=mig&mig_profile=3g.40gb").content.decode()
    assert "not in the layout" in bad


@pytest.mark.parametrize("pool, amount, booked, grant", [
    ("mig", {"mig_profile": "1g.10gb", "count": 2}, "2 × 1g.10gb", "1g.10gb"),
    ("ts", {"shares": 2}, "2 of 4 shares", "2 of 4 shares"),
    ("mps", {"shares": 1}, "1 of 4 shares", "1 of 4 shares (≤ 20 GiB, 25 % SMs)"),
    ("hami", {"gpu_memory_mib": 20480, "gpu_cores_pct": 30}, "20 GiB + 30 % cores", "20 GiB + 30 % cores"),
    ("whole", {"gpus": 1}, "1 GPU", "whole GPU"),
])
def test_the_form_books_each_mode_and_the_pages_say_what(fleet, pool, amount, booked, grant):
    client = client_for(fleet["member"])
    response = client.post("/reserve/", {"team": "vision", "pool": pool, "ends_at": ends(), **amount})
    assert response.status_code == 302, response.content.decode()[-3000:]
    reservation = Reservation.objects.get()
    listing = client.get("/reservations/").content.decode()
    assert f"Reserved {booked} of {pool.upper()}" in listing and booked in listing
    detail = client.get(f"/reservations/{reservation.pk}/").content.decode()
    assert booked in detail and grant in detail
    bars = client.get(f"/pools/{pool}/").content.decode()
    assert f'data-reservation="{reservation.pk}"' in bars and f"vision #{reservation.pk}" in bars
    # Another team sees who holds the part, not the reservation's id or link.
    theirs = client_for(fleet["stranger"]).get(f"/pools/{pool}/").content.decode()
    assert 'data-team="vision"' in theirs and f"#{reservation.pk}" not in theirs


@pytest.mark.parametrize("pool, amount, field, words", [
    ("ts", {"shares": 5}, "shares", "less than or equal to 4"),
    ("mig", {"mig_profile": "1g.10gb", "count": 8}, "count", "8 × 1g.10gb requested but only 7"),
    ("hami", {"gpu_memory_mib": 999999}, "gpu_memory_mib", "more than the memory of any GPU"),
    ("hami", {"gpu_memory_mib": 1024, "gpu_memory_pct": 10}, "gpu_memory_pct", "not both"),
])
def test_refusals_sit_next_to_the_field(fleet, pool, amount, field, words):
    response = client_for(fleet["member"]).post("/reserve/", {"team": "vision", "pool": pool, "ends_at": ends(),
                                                             **amount})
    assert response.status_code == 400
    page = response.content.decode()
    start = page.index(f'data-field="{field}"')
    assert words in page[start:start + 400]
    assert not Reservation.objects.exists()


def test_the_pool_page_shows_free_parts(fleet):
    client = client_for(fleet["member"])
    client.post("/reserve/", {"team": "vision", "pool": "ts", "ends_at": ends(), "shares": 3})
    page = client.get("/pools/ts/").content.decode()
    assert "3 of 4 shares · 0.75 GE" in page and "1 share free" in page
    mig = client.get("/pools/mig/").content.decode()
    assert mig.count("title=\"1g.10gb free\"") == 7
    hami = client.get("/pools/hami/").content.decode()
    assert "80 GiB free" in hami and "100 % cores free" in hami
