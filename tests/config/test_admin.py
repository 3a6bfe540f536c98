"""The admin is the portal's, written for platform staff: its own header, names people use (GPU, GE, MiB),
the quota list with current use, the reservation list filtered by requester, team, state and window, and
measured values rounded."""
from __future__ import annotations

import re
from datetime import timedelta

import pytest
from django.contrib import admin
from django.test import Client, RequestFactory
from django.urls import reverse
from django.utils import timezone

from allocations.models import Reservation
from monitoring.models import Alert, AlertRule
from tests.factories import window

APPS = ("inventory", "allocations", "teams", "monitoring")
# Lower-case acronyms are what Django makes of field names like max_ge or memory_mib ("max ge", "memory mib").
LOWERCASE_ACRONYM = re.compile(r"\b(gpus?|ge|mib|uuid|mig|cpu|url|api|pct|id)\b")


@pytest.fixture
def staff_client(world) -> Client:
    client = Client()
    client.force_login(world.staff)
    return client


def _registered():
    return [model for model in admin.site._registry if model._meta.app_label in APPS]


def test_the_admin_names_the_portal_and_its_models_as_people_say_them(staff_client):
    page = staff_client.get("/admin/").content.decode()
    assert "GPU Pool Portal administration" in page and "Django administration" not in page
    assert "<title>Pools, quotas, reservations and alerts | GPU Pool Portal admin</title>" in page
    for name in ("GPU pools", "Priority classes", "API tokens"):
        assert f">{name}<" in page
    assert "Gpu pools" not in page and "Priority classs" not in page


def test_every_admin_model_and_field_is_labelled_without_lowercase_acronyms():
    bad = []
    for model in _registered():
        names = [str(model._meta.verbose_name), str(model._meta.verbose_name_plural)]
        names += [str(f.verbose_name) for f in model._meta.get_fields()
                  if hasattr(f, "verbose_name") and not f.auto_created]
        bad += [f"{model.__name__}: {name}" for name in names if LOWERCASE_ACRONYM.search(name)]
    assert bad == []


def test_every_admin_list_and_form_opens(world, staff_client):
    request = RequestFactory().get("/admin/")
    request.user = world.staff
    for model in _registered():
        meta = model._meta
        listing = staff_client.get(reverse(f"admin:{meta.app_label}_{meta.model_name}_changelist"))
        assert listing.status_code == 200, meta.model_name
        if admin.site._registry[model].has_add_permission(request):
            form = staff_client.get(reverse(f"admin:{meta.app_label}_{meta.model_name}_add"))
            assert form.status_code == 200, meta.model_name


def test_the_quota_list_shows_what_each_team_holds_now(world, staff_client, api):
    _, end = window(0, 2)
    created = api(world.member).post("/api/v1/reservations/", {"pool": "a100", "team": "ml", "gpus": 3,
                                                                "ends_at": end.isoformat()}, format="json")
    assert created.status_code == 201
    page = staff_client.get("/admin/allocations/quota/").content.decode()
    assert "Held now (GE)" in page and "Max GE" in page
    row = re.search(r'<tr[^>]*>(?:(?!</tr>).)*>ml<(?:(?!</tr>).)*</tr>', page.replace(">ML<", ">ml<"), re.S)
    assert row and "3.00 (50 %)" in row.group(0)  # 3 of the 6 GE of ML's quota in a100
    assert page.count("0.00") >= 2  # the other quotas hold nothing


def test_the_reservation_list_filters_by_requester_team_state_and_window(world, staff_client, api):
    _, end = window(0, 2)
    api(world.member).post("/api/v1/reservations/", {"pool": "a100", "team": "ml", "gpus": 1,
                                                     "ends_at": end.isoformat()}, format="json")
    api(world.outsider).post("/api/v1/reservations/", {"pool": "a100", "team": "infra", "gpus": 2,
                                                       "ends_at": end.isoformat()}, format="json")
    mine, theirs = Reservation.objects.order_by("pk")
    listing = staff_client.get("/admin/allocations/reservation/").content.decode()
    for heading in ("By requester", "By team", "By state", "By window", "By starts at"):
        assert heading in listing
    assert "Requester" in listing and ">member<" in listing and ">outsider<" in listing

    def ids(query: str) -> set[int]:
        page = staff_client.get(f"/admin/allocations/reservation/?{query}").content.decode()
        return {int(i) for i in re.findall(r'/admin/allocations/reservation/(\d+)/change/', page)}

    assert ids(f"requested_by__id__exact={world.member.pk}") == {mine.pk}
    assert ids(f"team__id__exact={world.other_team.pk}") == {theirs.pk}
    assert ids(f"state={mine.state}") == {mine.pk, theirs.pk}
    later = api(world.member).post("/api/v1/reservations/", {
        "pool": "a100", "team": "ml", "gpus": 1, "starts_at": window(30, 2)[0].isoformat(),
        "ends_at": window(30, 2)[1].isoformat()}, format="json").json()["id"]
    assert ids("window=now") == {mine.pk, theirs.pk}
    assert ids("window=next24h") == set() and ids("window=next7d") == {later}
    assert ids("window=past7d") == set()
    tomorrow = (timezone.localdate() + timedelta(days=1)).isoformat()
    assert ids(f"starts_at__gte={tomorrow}") == {later}
    today = timezone.localdate().isoformat()
    assert ids(f"starts_at__gte={today}&starts_at__lt={tomorrow}") == {mine.pk, theirs.pk}


def test_alert_values_are_rounded_for_people(world, staff_client):
    rule = AlertRule.objects.create(name="Hot", metric="gpu_temperature", scope="gpu", threshold=90, for_seconds=0)
    alert = Alert.objects.create(rule=rule, subject="gpu:1", subject_label="lab/node-a GPU 0",
                                 value=95.00086828167058, active_since=timezone.now(), state="firing")
    for url in ("/admin/monitoring/alert/", f"/admin/monitoring/alert/{alert.pk}/change/"):
        page = staff_client.get(url).content.decode()
        assert "95.0" in page and "95.000868" not in page, url
