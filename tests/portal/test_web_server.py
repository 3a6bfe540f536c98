"""`python -m portal.web`, the Procfile's web process: Granian serving the WSGI app."""
from __future__ import annotations

import os
import subprocess
import sys
from datetime import timedelta
from types import SimpleNamespace

import httpx
import pytest
from django.utils import timezone
from rest_framework.authtoken.models import Token

from inventory.models import Gpu
from inventory.services import host_token_create
from tests.conftest import BASE_DIR, free_port, healthz_answers, start_server, stop_process_group
from tests.factories import MembershipFactory, PoolFactory, QuotaFactory, TeamFactory, UserFactory, add_node


def test_it_serves_the_portal_over_keep_alive_connections(tmp_path):
    port = free_port()
    env = dict(os.environ, WEB_WORKERS="1", WEB_THREADS="2", PORT=str(port))
    base = f"http://127.0.0.1:{port}"
    process = start_server([sys.executable, "-m", "portal.web"], env=env, log_path=tmp_path / "web.log",
                           ready=healthz_answers(base), what="python -m portal.web")
    try:
        with httpx.Client(base_url=base) as client:
            answers = [client.get("/healthz") for _ in range(20)]
            assert {a.status_code for a in answers} == {200}
            assert client.get("/readyz").json()["database"] == "ok"
            assert client.get("/api/v1/reservations/").status_code == 401
    finally:
        stop_process_group(process)


def test_it_refuses_settings_it_cannot_use():
    bad_number = subprocess.run([sys.executable, "-m", "portal.web"], env=dict(os.environ, WEB_WORKERS="many"),
                                cwd=BASE_DIR, capture_output=True, text=True, timeout=30)
    assert bad_number.returncode != 0 and "WEB_WORKERS must be a whole number" in bad_number.stderr
    half_tls = subprocess.run([sys.executable, "-m", "portal.web", "--ssl-certificate", "x.crt"], cwd=BASE_DIR,
                              capture_output=True, text=True, timeout=30)
    assert half_tls.returncode != 0 and "needs both a certificate and its key" in half_tls.stderr


@pytest.fixture
def portal_with_data(worker_env, tmp_path):
    """The real web server on the test's database, with pool a100 (8 GPUs on host node-a), team ml holding
    a quota there, its member with an API token, and a host token for node-a."""
    pool = PoolFactory(slug="a100")
    add_node(pool, "node-a", 8)
    team = TeamFactory(slug="ml")
    quota = QuotaFactory(team=team, pool=pool, max_gpus=4)
    member = UserFactory(username="member")
    MembershipFactory(user=member, team=team)
    staff = UserFactory(username="staff", is_staff=True)
    _, host_key = host_token_create(actor=staff, cluster=pool.gpus.first().node.cluster, host_name="node-a")
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    process = start_server([sys.executable, "-m", "portal.web"],
                           env=dict(worker_env, WEB_WORKERS="1", WEB_THREADS="2", PORT=str(port)),
                           log_path=tmp_path / "web.log", ready=healthz_answers(base), what="python -m portal.web")
    yield SimpleNamespace(base=base, token=Token.objects.create(user=member).key, host_key=host_key, quota=quota,
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
        (member, "PATCH", f"/api/v1/quotas/{portal.quota.pk}/", {"max_gpus": 1}, 403),
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
    finally:
        member.close()
        stranger.close()
    assert failures == []
