"""Redis or PostgreSQL going away under the real web server (`python -m config.web`), and coming back.

Each test runs its own Redis or PostgreSQL (tests/outages.py), stops it as a crash would, and
checks what keep-alive clients get: the API's JSON 503 with Retry-After for what needs the
missing service, everything else as usual, nothing half-written, and service again once it is back.
The figures printed (-s) are the ones the notes quote.
"""
from __future__ import annotations

import os
import subprocess
import sys
import time
from datetime import timedelta

import httpx
import pytest
from django.contrib.auth.hashers import PBKDF2PasswordHasher
from django.utils import timezone

from allocations.models import Reservation
from benchmarks.outage import SEED
from inventory.models import Gpu
from inventory.services import host_token_create
from monitoring.models import Sample
from teams.services import api_token_create
from tests.conftest import BASE_DIR, free_port, healthz_answers, start_server, stop_process_group, wait_for
from tests.factories import PASSWORD, MembershipFactory, PoolFactory, QuotaFactory, TeamFactory, UserFactory, add_node
from tests.outages import private_postgres, private_redis  # noqa: F401

pytestmark = pytest.mark.integration


def start_portal(env: dict, tmp_path, name: str = "web"):
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    env = dict(env, WEB_WORKERS="1", WEB_THREADS="2", PORT=str(port))
    process = start_server([sys.executable, "-m", "config.web"], env=env, log_path=tmp_path / f"{name}.log",
                           ready=healthz_answers(base), what="python -m config.web")
    return process, base


def timed(call, *args, **kwargs) -> tuple[float, httpx.Response]:
    started = time.monotonic()
    response = call(*args, **kwargs)
    return time.monotonic() - started, response


def assert_unavailable(response: httpx.Response, rule: str) -> None:
    assert response.status_code == 503, response.text[:300]
    assert response.headers["content-type"].startswith("application/json"), response.text[:300]
    body = response.json()
    assert body["errors"][0]["rule"] == rule and body["errors"][0]["field"] == "" and body["detail"]
    assert int(response.headers["retry-after"]) > 0


def sign_in(client: httpx.Client, username: str) -> None:
    """A browser's sign-in through the login form (session cookie)."""
    client.get("/login/")
    answer = client.post("/login/", data={"username": username, "password": PASSWORD,
                                          "csrfmiddlewaretoken": client.cookies["csrftoken"]})
    assert answer.status_code == 302, answer.text[:300]


def telemetry(gpus, seq: int) -> dict:
    sample = {"utilization_gpu_pct": 50, "utilization_memory_pct": 20, "memory_used_mib": 1000,
              "memory_total_mib": 81559, "temperature_c": 50, "power_w": 300.0}
    return {"stream": "outage-test", "batches": [{"seq": seq, "t": time.time(),
                                                  "gpus": [dict(sample, uuid=gpu.uuid) for gpu in gpus]}]}


def test_while_redis_is_down_the_api_serves_the_database_and_answers_503_json_for_what_needs_redis(
        worker_env, private_redis, tmp_path):
    pool = PoolFactory(slug="a100")
    add_node(pool, "node-a", 4)
    team = TeamFactory(slug="ml")
    QuotaFactory(team=team, pool=pool, max_ge=4)
    member = UserFactory(username="member")
    # Hashed as the server checks it (the suite's settings use a faster hasher the server does not have).
    member.password = PBKDF2PasswordHasher().encode(PASSWORD, "outagetestsalt")
    member.save()
    MembershipFactory(user=member, team=team)
    staff = UserFactory(username="staff", is_staff=True)
    _, host_key = host_token_create(actor=staff, cluster=pool.gpus.first().node.cluster, host_name="node-a")
    gpus = list(Gpu.objects.filter(pool=pool))
    env = dict(worker_env, REDIS_URL=private_redis.url(), METRICS_TOKEN="outage-test-metrics")
    web, base = start_portal(env, tmp_path)
    _, key = api_token_create(user=member)
    api = httpx.Client(base_url=base, timeout=30, headers={"Authorization": f"Token {key}"})
    agent = httpx.Client(base_url=base, timeout=30, headers={"Authorization": f"Host {host_key}"})
    browser = httpx.Client(base_url=base, timeout=30)
    ends_at = (timezone.now() + timedelta(hours=2)).isoformat()
    try:
        assert api.get("/api/v1/pools/").status_code == 200  # the token is now cached in Redis
        private_redis.stop()

        # What reads or writes the database works: token lookup falls back to the database, the
        # reservation commits and its activation is left to the sweep.
        assert api.get("/api/v1/pools/").status_code == 200
        assert api.get("/api/v1/reservations/").status_code == 200
        create_s, created = timed(api.post, "/api/v1/reservations/",
                                  json={"pool": "a100", "team": "ml", "gpus": 2, "ends_at": ends_at})
        assert created.status_code == 201, created.text[:300]
        assert created.json()["state"] == "scheduled"
        released = api.post(f"/api/v1/reservations/{created.json()['id']}/release/")
        assert released.status_code == 200, released.text[:300]
        kept = api.post("/api/v1/reservations/", json={"pool": "a100", "team": "ml", "gpus": 1, "ends_at": ends_at})
        assert kept.status_code == 201, kept.text[:300]
        login = httpx.post(f"{base}/api/v1/auth/token/", json={"username": "member", "password": PASSWORD})
        assert login.status_code == 200, login.text[:300]
        sign_in(browser, "member")
        dashboard = browser.get("/")
        assert dashboard.status_code == 200 and 'id="usage-unavailable"' in dashboard.text

        # What needs Redis itself: the API's 503, quickly, and nothing stored.
        ingest_s, ingest = timed(agent.post, "/api/v1/agent/telemetry/", json=telemetry(gpus, seq=1))
        assert_unavailable(ingest, "broker_unavailable")
        assert_unavailable(api.get("/metrics", headers={"Authorization": "Bearer outage-test-metrics"}), "broker_unavailable")
        assert ingest_s < 1.0
        assert not Sample.objects.exists()
        ready = api.get("/readyz")
        assert ready.status_code == 503 and ready.json()["broker"] != "ok" and ready.json()["database"] == "ok"
        assert api.get("/healthz").status_code == 200
        reservation = Reservation.objects.get(pk=kept.json()["id"])
        assert reservation.state == "scheduled" and reservation.allocations.count() == 1

        # Redis back: telemetry is taken again at once, and the sweep activates the reservation whose
        # task could not be queued.
        private_redis.start()
        back = time.monotonic()
        wait_for(lambda: agent.post("/api/v1/agent/telemetry/", json=telemetry(gpus, seq=2)).status_code == 200,
                 timeout=10, message="telemetry accepted again")
        recovered_s = time.monotonic() - back
        assert Sample.objects.count() == len(gpus)
        worker = start_server(
            [sys.executable, "-m", "celery", "-A", "config", "worker", "-B", "--pool=threads", "--concurrency=2", "--loglevel=INFO",
             "--without-mingle", "--without-gossip", "--schedule", str(tmp_path / "beat-schedule")],
            env=env, log_path=tmp_path / "worker.log", what="the Celery worker",
            ready=lambda: b"ready." in (tmp_path / "worker.log").read_bytes())
        try:
            wait_for(lambda: Reservation.objects.get(pk=reservation.pk).state != "scheduled", timeout=30,
                     message="the sweep to activate the reservation created while Redis was down")
        finally:
            stop_process_group(worker)
        print(f"\nRedis down: create {create_s * 1000:.0f} ms (201), telemetry 503 in {ingest_s * 1000:.0f} ms; "
              f"telemetry accepted {recovered_s:.2f} s after Redis started")
    finally:
        for client in (api, agent, browser):
            client.close()
        stop_process_group(web)


def test_while_postgresql_is_down_requests_answer_503_at_once_and_service_returns_with_it(
        private_postgres, settings, tmp_path):
    env = dict(os.environ, DATABASE_URL=private_postgres.url, REDIS_URL=settings.REDIS_URL,
               PORTAL_VAR_DIR=str(tmp_path), PYTHONUNBUFFERED="1")
    subprocess.run([sys.executable, "manage.py", "migrate", "-v0"], env=env, cwd=BASE_DIR, check=True, timeout=120)
    seeded = subprocess.run([sys.executable, "manage.py", "shell", "-c", SEED], env=env, cwd=BASE_DIR, check=True,
                            timeout=60, capture_output=True, text=True).stdout
    token = next(line.split()[1] for line in seeded.splitlines() if line.startswith("TOKEN "))
    web, base = start_portal(env, tmp_path)
    api = httpx.Client(base_url=base, timeout=30, headers={"Authorization": f"Token {token}"})
    browser = httpx.Client(base_url=base, timeout=30)
    ends_at = (timezone.now() + timedelta(hours=2)).isoformat()
    try:
        assert api.get("/api/v1/reservations/").status_code == 200
        sign_in(browser, "member")
        assert browser.get("/reservations/").status_code == 200
        private_postgres.stop()

        first_s, first = timed(api.get, "/api/v1/reservations/")
        assert_unavailable(first, "database_unavailable")
        later = [timed(api.get, "/api/v1/reservations/") for _ in range(5)]
        later += [timed(api.post, "/api/v1/reservations/",
                        json={"pool": "a100", "team": "ml", "gpus": 1, "ends_at": ends_at})]
        for _, answer in later:
            assert_unavailable(answer, "database_unavailable")
        slowest = max(seconds for seconds, _ in later)
        assert slowest < 2.0, f"a request took {slowest:.2f} s with the database known down"
        page = browser.get("/reservations/")
        assert page.status_code == 503 and "Temporarily unavailable" in page.text and page.headers["retry-after"]
        assert api.get("/healthz").status_code == 200
        ready = api.get("/readyz")
        assert ready.status_code == 503 and ready.json()["database"] != "ok"

        private_postgres.start()
        back = time.monotonic()
        wait_for(lambda: api.get("/api/v1/reservations/").status_code == 200, timeout=15, interval=0.1,
                 message="the API to read the database again")
        recovered_s = time.monotonic() - back
        created = api.post("/api/v1/reservations/", json={"pool": "a100", "team": "ml", "gpus": 1, "ends_at": ends_at})
        assert created.status_code == 201, created.text[:300]
        assert browser.get("/reservations/").status_code == 200
        print(f"\nPostgreSQL down: first request 503 in {first_s * 1000:.0f} ms, then at most {slowest * 1000:.0f} ms; "
              f"served again {recovered_s:.2f} s after PostgreSQL started")
    finally:
        api.close()
        browser.close()
        stop_process_group(web)


def test_only_failures_that_mean_a_service_is_gone_count_as_an_outage():
    import kombu.exceptions
    import psycopg
    import redis
    from django.db import OperationalError
    from psycopg_pool import PoolTimeout

    from common.outages import as_service_unavailable

    def raised_by_django(cause: Exception) -> OperationalError:
        error = OperationalError(str(cause))
        error.__cause__ = cause
        return error

    def rule(exc):
        outage = as_service_unavailable(exc)
        return outage.errors[0].rule if outage is not None else None

    assert rule(raised_by_django(psycopg.OperationalError("connection refused"))) == "database_unavailable"
    assert rule(raised_by_django(PoolTimeout("couldn't get a connection after 10.00 sec"))) == "database_unavailable"
    assert rule(raised_by_django(psycopg.errors.AdminShutdown("terminating connection"))) == "database_unavailable"
    assert rule(redis.exceptions.ConnectionError("refused")) == "broker_unavailable"
    assert rule(kombu.exceptions.OperationalError("refused")) == "broker_unavailable"
    # The database answered and refused one statement: not an outage (a lock timeout, SQLite's lock).
    assert rule(raised_by_django(psycopg.errors.LockNotAvailable("could not obtain lock"))) is None
    assert rule(OperationalError("database is locked")) is None
    assert rule(ValueError("a bug")) is None
