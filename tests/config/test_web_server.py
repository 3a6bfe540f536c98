"""`python -m config.web`, the Procfile's web process: Granian serving the WSGI app."""
from __future__ import annotations

import os
import subprocess
import sys
import time
from datetime import timedelta
from types import SimpleNamespace

import httpx
import orjson
import pytest
from django.utils import timezone

from inventory.models import Gpu
from inventory.services import host_token_create
from teams.services import api_token_create
from tests.conftest import BASE_DIR, free_port, healthz_answers, start_server, stop_process_group
from tests.factories import MembershipFactory, PoolFactory, QuotaFactory, TeamFactory, UserFactory, add_node


def test_it_serves_the_portal_over_keep_alive_connections(tmp_path):
    port = free_port()
    env = dict(os.environ, WEB_WORKERS="1", WEB_THREADS="2", PORT=str(port))
    base = f"http://127.0.0.1:{port}"
    process = start_server([sys.executable, "-m", "config.web"], env=env, log_path=tmp_path / "web.log",
                           ready=healthz_answers(base), what="python -m config.web")
    try:
        with httpx.Client(base_url=base) as client:
            answers = [client.get("/healthz") for _ in range(20)]
            assert {a.status_code for a in answers} == {200}
            assert client.get("/readyz").json()["database"] == "ok"
            assert client.get("/api/v1/reservations/").status_code == 401
    finally:
        stop_process_group(process)


def test_it_refuses_settings_it_cannot_use():
    bad_number = subprocess.run([sys.executable, "-m", "config.web"], env=dict(os.environ, WEB_WORKERS="many"),
                                cwd=BASE_DIR, capture_output=True, text=True, timeout=30)
    assert bad_number.returncode != 0 and "WEB_WORKERS must be a whole number" in bad_number.stderr
    half_tls = subprocess.run([sys.executable, "-m", "config.web", "--ssl-certificate", "x.crt"], cwd=BASE_DIR,
                              capture_output=True, text=True, timeout=30)
    assert half_tls.returncode != 0 and "needs both a certificate and its key" in half_tls.stderr


@pytest.fixture
def portal_with_data(worker_env, tmp_path):
    """The real web server on the test's database, with pool a100 (8 GPUs on host node-a), team ml holding
    a quota there, its member with an API token, and a host token for node-a."""
    pool = PoolFactory(slug="a100")
    add_node(pool, "node-a", 8)
    team = TeamFactory(slug="ml")
    quota = QuotaFactory(team=team, pool=pool, max_ge=4)
    member = UserFactory(username="member")
    MembershipFactory(user=member, team=team)
    staff = UserFactory(username="staff", is_staff=True)
    _, host_key = host_token_create(actor=staff, cluster=pool.gpus.first().node.cluster, host_name="node-a")
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    process = start_server([sys.executable, "-m", "config.web"],
                           env=dict(worker_env, WEB_WORKERS="1", WEB_THREADS="2", PORT=str(port)),
                           log_path=tmp_path / "web.log", ready=healthz_answers(base), what="python -m config.web")
    yield SimpleNamespace(base=base, token=api_token_create(user=member)[1], host_key=host_key, quota=quota,
                          gpus=list(Gpu.objects.filter(pool=pool)))
    stop_process_group(process)


def test_a_refusal_that_did_not_read_the_body_leaves_the_keep_alive_connection_usable(portal_with_data):
    portal = portal_with_data
    member = httpx.Client(base_url=portal.base, timeout=10, headers={"Authorization": f"Token {portal.token}"})
    stranger = httpx.Client(base_url=portal.base, timeout=10, headers={"Authorization": "Token not-a-token"})
    ends_at = (timezone.now() + timedelta(hours=1)).isoformat()
    reservation = member.post("/api/v1/reservations/", json={"pool": "a100", "team": "ml", "gpus": 1,
                                                              "ends_at": ends_at}).json()["id"]
    assert member.post(f"/api/v1/reservations/{reservation}/release/").status_code == 200
    refusals = [
        (member, "PATCH", f"/api/v1/quotas/{portal.quota.pk}/", {"max_ge": 1}, 403),
        (stranger, "POST", "/api/v1/reservations/", {"pool": "a100", "team": "ml", "gpus": 1}, 401),
        (member, "POST", f"/api/v1/reservations/{reservation}/release/", {"reason": "again"}, 409),
    ]
    failures = []
    try:
        for _ in range(100):
            for client, method, path, body, status in refusals:
                assert client.request(method, path, json=body).status_code == status
                try:
                    client.get("/api/v1/pools/")  # the same kept-alive connection
                except httpx.HTTPError as error:
                    failures.append(f"after {method} {path}: {error!r}")
            # A chunked body (no Content-Length), refused before it is read.
            chunked = stranger.post("/api/v1/reservations/", content=iter([b'{"pool": ', b'"a100"}']),
                                    headers={"content-type": "application/json"})
            assert chunked.status_code == 401
            try:
                stranger.get("/healthz")
            except httpx.HTTPError as error:
                failures.append(f"after a chunked POST: {error!r}")
    finally:
        member.close()
        stranger.close()
    assert failures == []


def realistic_telemetry(gpus, samples: int) -> dict:
    """`samples` samples as `python -m agent` sends them (two processes each), one batch per second."""
    now = time.time()
    batches = []
    for seq in range(samples // len(gpus) + 1):
        batches.append({"seq": seq + 1, "t": now - samples // len(gpus) + seq, "gpus": [
            {"uuid": gpu.uuid, "utilization_gpu_pct": 87, "utilization_memory_pct": 41, "memory_used_mib": 61234,
             "memory_total_mib": 81559, "temperature_c": 67, "power_w": 612.4,
             "processes": [{"pid": 184467, "used_memory_mib": 40960}, {"pid": 184501, "used_memory_mib": 20274}]}
            for gpu in gpus]})
    extra = len(batches) * len(gpus) - samples
    batches[-1]["gpus"] = batches[-1]["gpus"][:len(gpus) - extra]
    return {"stream": "size-test", "batches": batches}


def test_every_body_past_a_limit_is_refused_in_the_api_shape_and_the_telemetry_limit_fits_its_samples(
        portal_with_data, settings):
    portal = portal_with_data
    agent = httpx.Client(base_url=portal.base, timeout=60, headers={"Authorization": f"Host {portal.host_key}"})
    member = httpx.Client(base_url=portal.base, timeout=60, headers={"Authorization": f"Token {portal.token}"})
    try:
        # The documented maximum of samples, at a realistic size (well past Django's 2.5 MB), is taken...
        most = orjson.dumps(realistic_telemetry(portal.gpus, settings.TELEMETRY_MAX_SAMPLES_PER_REQUEST))
        assert len(most) > settings.DATA_UPLOAD_MAX_MEMORY_SIZE
        accepted = agent.post("/api/v1/agent/telemetry/", content=most, headers={"content-type": "application/json"})
        assert accepted.status_code == 200, accepted.text[:300]
        assert accepted.json()["accepted"] == settings.TELEMETRY_MAX_SAMPLES_PER_REQUEST
        # ...one sample more is the documented 413...
        over = realistic_telemetry(portal.gpus, settings.TELEMETRY_MAX_SAMPLES_PER_REQUEST + 1)
        refused = agent.post("/api/v1/agent/telemetry/", json=over)
        assert refused.status_code == 413 and refused.json()["errors"][0]["rule"] == "too_large"
        # ...and a body past the ingest's own byte limit is a 413 naming the body.
        huge = b'{"stream": "s", "batches": [], "pad": "' + b"x" * settings.TELEMETRY_MAX_BODY_BYTES + b'"}'
        too_big = agent.post("/api/v1/agent/telemetry/", content=huge, headers={"content-type": "application/json"})
        assert too_big.status_code == 413, too_big.text[:300]
        assert too_big.headers["connection"] == "close"  # refused on its Content-Length: not worth receiving
        assert too_big.json()["errors"][0] | {"message": ""} == {"field": "body", "rule": "too_large", "message": ""}

        # Elsewhere under /api/ Django's limits answer JSON too: a body past DATA_UPLOAD_MAX_MEMORY_SIZE...
        padded = orjson.dumps({"pool": "a100", "team": "ml", "gpus": 1, "pad": "x" * settings.DATA_UPLOAD_MAX_MEMORY_SIZE})
        large = member.post("/api/v1/reservations/", content=padded, headers={"content-type": "application/json"})
        assert large.status_code == 413, large.text[:300]
        assert large.json()["errors"][0]["field"] == "body" and large.json()["errors"][0]["rule"] == "too_large"
        # ...and a form with more fields than DATA_UPLOAD_MAX_NUMBER_FIELDS.
        fields = "&".join(f"f{i}=1" for i in range(settings.DATA_UPLOAD_MAX_NUMBER_FIELDS + 1))
        many = httpx.post(f"{portal.base}/api/v1/auth/token/", content=fields,
                          headers={"content-type": "application/x-www-form-urlencoded"})
        assert many.status_code == 400, many.text[:300]
        assert many.json()["errors"][0]["field"] == "body" and many.json()["errors"][0]["rule"] == "too_many_fields"
        # The connection that carried a refused, unread body still serves (or was closed and is replaced).
        assert member.get("/api/v1/pools/").status_code == 200
        assert agent.post("/api/v1/agent/heartbeat/", json={}).status_code in (200, 400)
    finally:
        agent.close()
        member.close()
