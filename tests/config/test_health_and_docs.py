"""/healthz, /readyz, /metrics, the OpenAPI schema and the docs page."""
from __future__ import annotations

import os
import subprocess
import sys
from datetime import timedelta

import pytest
from django.test import Client
from django.utils import timezone

from tests.conftest import BASE_DIR
from tests.factories import window


def test_healthz_answers(db):
    assert Client().get("/healthz").json() == {"status": "ok"}


def test_readyz_checks_database_and_broker(db):
    response = Client().get("/readyz")
    assert response.status_code == 200
    assert response.json() == {"status": "ok", "database": "ok", "broker": "ok"}


def test_readyz_says_which_part_is_down(db, monkeypatch):
    from config import health

    monkeypatch.setattr(health.celery_app.conf, "broker_url", "redis://127.0.0.1:1/0")
    response = Client().get("/readyz")
    assert response.status_code == 503
    assert response.json()["database"] == "ok" and response.json()["broker"] != "ok"


def test_metrics_report_pools_and_reservations(world, api, settings):
    _, end = window(0, 1)
    api(world.member).post("/api/v1/reservations/", {"pool": "a100", "team": "ml", "gpus": 2,
                                                     "ends_at": end.isoformat()}, format="json")
    settings.METRICS_PUBLIC = True  # as behind an ingress that guards it
    text = Client().get("/metrics").content.decode()
    assert 'gpupool_pool_gpus{kind="allocated",pool="a100"} 2.0' in text
    assert 'gpupool_reservations{state="scheduled"} 1.0' in text
    assert 'gpupool_team_gpus_allocated{pool="a100",team="ml"} 2.0' in text


def test_the_openapi_schema_and_docs_are_served(world, api):
    schema = api(world.member).get("/api/v1/schema/?format=json")
    assert schema.status_code == 200
    paths = schema.json()["paths"]
    assert "/api/v1/reservations/" in paths and "/api/v1/pools/{slug}/availability/" in paths
    # The timeline is one array of slots, as the view answers it (test_api_schema checks every answer).
    availability = paths["/api/v1/pools/{slug}/availability/"]["get"]["responses"]["200"]
    assert availability["content"]["application/json"]["schema"] == {
        "type": "array", "items": {"$ref": "#/components/schemas/Slot"}}
    # gpu_models is a list in the query: the parameter repeated (OpenAPI's default for a query array).
    parameters = {p["name"]: p for p in paths["/api/v1/pools/{slug}/availability/"]["get"]["parameters"]}
    models = parameters["gpu_models"]
    assert (models["in"], models["schema"]["type"], models["schema"]["items"]["type"]) == ("query", "array", "string")
    assert models.get("explode", True) and models.get("style", "form") == "form"
    assert api(world.member).get("/api/v1/docs/").status_code == 200


def test_availability_counts_free_gpus_per_slot(world, api):
    start = timezone.now().replace(microsecond=0)
    client = api(world.member)
    client.post("/api/v1/reservations/", {"pool": "a100", "team": "ml", "gpus": 3,
                                          "ends_at": (start + timedelta(hours=1.5)).isoformat()}, format="json")
    slots = client.get("/api/v1/pools/a100/availability/", {
        "start": start.isoformat(), "end": (start + timedelta(hours=3)).isoformat(), "slot": 3600}).json()
    assert [s["free"] for s in slots] == [5, 5, 8]
    assert [s["free_on_one_node"] for s in slots] == [4, 4, 4]


def test_availability_rejects_bad_ranges(world, api):
    client = api(world.member)
    start, end = window(0, 1)
    bad = client.get("/api/v1/pools/a100/availability/", {"start": end.isoformat(), "end": start.isoformat()})
    assert bad.status_code == 400 and bad.json()["errors"][0] == {
        "field": "end", "rule": "after_start", "message": "end must be after start."}
    too_many = client.get("/api/v1/pools/a100/availability/", {"start": start.isoformat(), "slot": 60,
                                                                "end": (start + (end - start) * 24 * 30).isoformat()})
    assert too_many.status_code == 400 and too_many.json()["errors"][0]["rule"] == "max_slots"
    assert client.get("/api/v1/pools/a100/availability/", {"slot": "x"}).json()["errors"][0]["field"] == "slot"


def test_metrics_can_require_a_token(db, settings):
    settings.METRICS_TOKEN = "s3cret"
    refused = Client().get("/metrics")
    assert refused.status_code == 401 and refused["WWW-Authenticate"].startswith("Bearer")
    assert Client().get("/metrics", HTTP_AUTHORIZATION="Bearer wrong").status_code == 401
    assert Client().get("/metrics", HTTP_AUTHORIZATION="Bearer s3cret").status_code == 200


def test_without_a_token_metrics_are_refused_outside_the_embedded_demo_unless_declared_public(db, settings):
    settings.METRICS_TOKEN, settings.METRICS_PUBLIC = "", False
    refused = Client().get("/metrics")
    assert refused.status_code == 403 and b"METRICS_TOKEN" in refused.content and b"METRICS_PUBLIC" in refused.content
    settings.METRICS_PUBLIC = True
    assert Client().get("/metrics").status_code == 200


@pytest.mark.parametrize("redis_url, public", [("", True), ("redis://127.0.0.1:6379/4", False)])
def test_metrics_are_public_by_default_only_in_the_embedded_demo(redis_url, public, tmp_path):
    env = dict(os.environ, REDIS_URL=redis_url, SECRET_KEY="x" * 50, DJANGO_SETTINGS_MODULE="config.settings",
               PORTAL_VAR_DIR=str(tmp_path))
    env.pop("METRICS_PUBLIC", None)
    code = "from django.conf import settings; print(settings.METRICS_PUBLIC)"
    out = subprocess.run([sys.executable, "-c", f"import django; django.setup(); {code}"], env=env, cwd=BASE_DIR,
                         capture_output=True, text=True, timeout=60, check=True).stdout
    assert out.strip() == str(public)


def test_a_metrics_token_with_non_ascii_characters_is_a_401(db, settings):
    # hmac.compare_digest takes str only when both are ASCII: "Bearer é" was a TypeError, a 500.
    settings.METRICS_TOKEN = "s3cret"
    refused = Client().get("/metrics", HTTP_AUTHORIZATION="Bearer s3crét")
    assert refused.status_code == 401 and refused["WWW-Authenticate"].startswith("Bearer")


def test_the_docs_page_loads_swagger_ui_from_our_own_static_files(world, api):
    """No CDN: every script, stylesheet and icon the docs page names is a path on this portal, and served."""
    import re

    html = api(world.member).get("/api/v1/docs/").content.decode()
    assert "cdn" not in html.lower() and "unpkg" not in html.lower()
    assert not re.search(r"""(?:src|href)\s*=\s*["'](?:https?:)?//""", html)
    urls = re.findall(r"""(?:src|href)\s*=\s*["']([^"']+)["']""", html)
    assets = [u for u in urls if u.startswith("/static/")]
    assert any(u.endswith("swagger-ui-bundle.js") for u in assets), urls
    assert any(u.endswith(".css") for u in assets), urls
    for url in assets:
        response = Client().get(url)  # WhiteNoise serves them, signed in or not
        assert response.status_code == 200, url
        if hasattr(response, "streaming_content"):
            b"".join(response.streaming_content)
            response.close()
