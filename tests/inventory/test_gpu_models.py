"""GPU model weights: everyone signed in reads them, staff set them (API and admin), every change is
recorded, and bad input is a 400 naming `weight` and the rule."""
from __future__ import annotations

from decimal import Decimal
from urllib.parse import quote

import pytest

from common.errors import NotFound, PermissionDenied, ValidationFailed
from inventory import services
from inventory.models import GpuModel, GpuModelWeightChange
from tests.factories import GpuFactory, PoolFactory, add_node

H100 = "NVIDIA H100 80GB HBM3"  # the factories' model: spaces in the name
URL = "/api/v1/gpu-models/"


def detail(name: str) -> str:
    return f"{URL}{quote(name)}/"


@pytest.fixture
def fleet(world):
    """The world's 10 H100s, plus 2 L4s in their own pool."""
    l4 = PoolFactory(slug="l4-cards")
    node = add_node(l4, "node-l4", 0)
    for index in range(2):
        GpuFactory(node=node, pool=l4, index=index, model_name="NVIDIA L4")
    return world


def test_everyone_signed_in_reads_every_model_with_its_weight_and_count(fleet, api):
    GpuModel.objects.create(name="NVIDIA L4", weight=Decimal("0.3"))
    for user in (fleet.owner, fleet.member, fleet.outsider, fleet.staff):
        response = api(user).get(URL)
        assert response.status_code == 200, response.content
        assert response.json() == [
            {"name": H100, "weight": 1.0, "weighted": False, "gpus": 10, "updated_at": None},
            {"name": "NVIDIA L4", "weight": 0.3, "weighted": True, "gpus": 2,
             "updated_at": response.json()[1]["updated_at"]},
        ]
    assert api().get(URL).status_code == 401


def test_staff_set_a_weight_by_the_url_encoded_name_and_the_change_is_recorded(fleet, api):
    client = api(fleet.staff)
    response = client.patch(detail(H100), {"weight": 0.6}, format="json")
    assert response.status_code == 200, response.content
    body = response.json()
    assert (body["name"], body["weight"], body["weighted"], body["gpus"]) == (H100, 0.6, True, 10)
    assert [(h["actor"], h["old_weight"], h["new_weight"]) for h in body["history"]] == [("staff", 1.0, 0.6)]
    assert GpuModel.objects.get(name=H100).weight == Decimal("0.600")

    client.patch(detail(H100), {"weight": "1.25"}, format="json")
    client.patch(detail(H100), {"weight": 1.25}, format="json")  # no change: nothing recorded
    history = api(fleet.member).get(detail(H100)).json()["history"]
    assert [(h["old_weight"], h["new_weight"]) for h in history] == [(0.6, 1.25), (1.0, 0.6)]
    assert GpuModelWeightChange.objects.count() == 2


@pytest.mark.parametrize("who", ["owner", "member", "outsider"])
def test_only_staff_change_weights(fleet, api, who):
    response = api(getattr(fleet, who)).patch(detail(H100), {"weight": 2}, format="json")
    assert response.status_code == 403
    assert not GpuModel.objects.exists() and not GpuModelWeightChange.objects.exists()
    assert api().patch(detail(H100), {"weight": 2}, format="json").status_code == 401


@pytest.mark.parametrize(("body", "field", "rule"), [
    ({"weight": 0}, "weight", "positive"),
    ({"weight": -1}, "weight", "positive"),
    ({"weight": "abc"}, "weight", "invalid"),
    ({"weight": True}, "weight", "invalid"),
    ({"weight": None}, "weight", "null"),
    ({"weight": "NaN"}, "weight", "invalid"),
    ({"weight": "Infinity"}, "weight", "invalid"),
    ({"weight": 0.0001}, "weight", "max_decimal_places"),
    ({"weight": 1000}, "weight", "max_whole_digits"),
    ({"weight": 1e300}, "weight", "max_digits"),
    ({}, "weight", "required"),
    ({"weight": 1, "wieght": 2}, "wieght", "unknown_field"),
])
def test_bad_input_is_a_400_naming_the_field_and_the_rule(fleet, api, body, field, rule):
    response = api(fleet.staff).patch(detail(H100), body, format="json")
    assert response.status_code == 400, response.content
    assert {"field": field, "rule": rule} in [{k: e[k] for k in ("field", "rule")} for e in response.json()["errors"]]
    assert not GpuModel.objects.exists()


def test_unknown_models_are_404_and_get_no_row(fleet, api):
    client = api(fleet.staff)
    assert client.get(detail("NVIDIA Z9000")).status_code == 404
    response = client.patch(detail("NVIDIA Z9000"), {"weight": 2}, format="json")
    assert response.status_code == 404
    assert response.json()["errors"][0]["rule"] == "does_not_exist"
    assert client.get(f"{URL}a%00b/").status_code == 404
    assert client.patch(f"{URL}{'x' * 300}/", {"weight": 2}, format="json").status_code == 404
    assert not GpuModel.objects.exists()


def test_a_model_with_a_row_but_no_gpus_left_is_still_listed_and_settable(fleet, api):
    GpuModel.objects.create(name="Tesla V100", weight=Decimal("0.5"))
    assert {"name": "Tesla V100", "gpus": 0, "weight": 0.5} .items() <= next(
        m for m in api(fleet.member).get(URL).json() if m["name"] == "Tesla V100").items()
    assert api(fleet.staff).patch(detail("Tesla V100"), {"weight": 0.4}, format="json").status_code == 200


def test_the_service_checks_who_and_what(fleet):
    with pytest.raises(PermissionDenied):
        services.gpu_model_weight_set(actor=fleet.owner, name=H100, weight=2)
    with pytest.raises(ValidationFailed) as refused:
        services.gpu_model_weight_set(actor=fleet.staff, name=H100, weight=Decimal("-0.5"))
    assert refused.value.errors[0].rule == "positive"
    with pytest.raises(ValidationFailed):
        services.gpu_model_weight_set(actor=fleet.staff, name=H100, weight=float("nan"))
    with pytest.raises(NotFound):
        services.gpu_model_weight_set(actor=fleet.staff, name="nope", weight=1)
    row = services.gpu_model_weight_set(actor=fleet.staff, name=H100, weight="0.75")
    assert row.weight == Decimal("0.750")
    # Setting 1.0 on a model without a row makes the row, records nothing (the weight did not change).
    services.gpu_model_weight_set(actor=fleet.staff, name="NVIDIA L4", weight=1)
    assert GpuModel.objects.filter(name="NVIDIA L4").exists()
    assert list(GpuModelWeightChange.objects.values_list("name", flat=True)) == [H100]


def test_the_admin_sets_weights_through_the_service_and_shows_the_history(fleet, client):
    client.force_login(fleet.staff)
    response = client.post("/admin/inventory/gpumodel/add/", {"name": H100, "weight": "0.8"})
    assert response.status_code == 302, response.content.decode()[:3000]
    row = GpuModel.objects.get(name=H100)
    assert row.weight == Decimal("0.800")
    response = client.post(f"/admin/inventory/gpumodel/{row.pk}/change/", {"weight": "1.5"})
    assert response.status_code == 302
    assert list(GpuModelWeightChange.objects.values_list("old_weight", "new_weight", "actor__username")) == [
        (Decimal("0.800"), Decimal("1.500"), "staff"), (Decimal("1.000"), Decimal("0.800"), "staff")]
    page = client.get(f"/admin/inventory/gpumodel/{row.pk}/change/").content.decode()
    assert "0.800 → 1.500" in page
    assert client.get("/admin/inventory/gpumodelweightchange/").status_code == 200
    listed = client.get("/admin/inventory/gpumodel/")
    assert listed.status_code == 200 and H100 in listed.content.decode()
    # Bad weights and unknown models show on the form.
    assert client.post(f"/admin/inventory/gpumodel/{row.pk}/change/", {"weight": "0"}).status_code == 200
    assert client.post("/admin/inventory/gpumodel/add/", {"name": "nope", "weight": "1"}).status_code == 200
    assert GpuModel.objects.get(name=H100).weight == Decimal("1.500")
