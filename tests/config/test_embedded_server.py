"""`make run`'s server for real: `manage.py runembedded` on a fresh SQLite database, driven over HTTP.

The rest of the suite runs on PostgreSQL; the hot paths' hand-written SQL (common/sql.py)
must hold on SQLite too, and this is where the embedded demo runs it.
"""
from __future__ import annotations

import os
import stat
import sys
from datetime import datetime, timedelta, timezone

import httpx
import pytest

from tests.conftest import free_port, healthz_answers, start_server, stop_process_group


@pytest.fixture
def embedded(tmp_path):
    port = free_port()
    env = {key: value for key, value in os.environ.items() if key not in ("DATABASE_URL", "REDIS_URL")}
    env.update(PORTAL_VAR_DIR=str(tmp_path / "var"), DEMO_ADMIN_PASSWORD="plenty-of-entropy-7q", PYTHONUNBUFFERED="1")
    base = f"http://127.0.0.1:{port}"
    # Within 180 s: in a fresh clone the first start also collects and compresses the static files (Plotly
    # among them) and loads the demo with its months of history; CI on a slow moment took over 60 s.
    process = start_server([sys.executable, "manage.py", "runembedded", "--port", str(port), "--no-agents"],
                           env=env, log_path=tmp_path / "embedded.log", ready=healthz_answers(base), what="runembedded",
                           within=180)
    credentials = tmp_path / "var" / "demo-credentials.txt"
    assert stat.S_IMODE(credentials.stat().st_mode) == 0o600
    assert stat.S_IMODE((tmp_path / "var").stat().st_mode) == 0o700
    assert stat.S_IMODE((tmp_path / "var" / "portal.sqlite3").stat().st_mode) == 0o600
    passwords = dict(line.split(" ", 1) for line in credentials.read_text().splitlines())
    try:
        yield base, passwords
    finally:
        stop_process_group(process)


def test_the_embedded_server_books_releases_and_lists_on_sqlite(embedded):
    base, passwords = embedded
    with httpx.Client(base_url=base, timeout=10) as client:
        token = client.post("/api/v1/auth/token/", json={"username": "bob", "password": passwords["bob"]}).json()
        headers = {"Authorization": f"Token {token['token']}"}
        start = datetime.now(timezone.utc) + timedelta(hours=2)
        body = {"pool": "h100", "team": "vision", "gpus": 2, "starts_at": start.isoformat(),
                "ends_at": (start + timedelta(hours=1)).isoformat()}

        first = client.post("/api/v1/reservations/", json=body, headers=headers)
        assert first.status_code == 201, first.text
        second = client.post("/api/v1/reservations/", json=body, headers=headers)
        assert second.status_code == 201, second.text
        taken = {g["uuid"] for g in first.json()["allocated_gpus"]} | {g["uuid"] for g in second.json()["allocated_gpus"]}
        assert len(taken) == 4, "two bookings of one window never share a GPU"
        assert first.json()["starts_at"].startswith(start.strftime("%Y-%m-%dT%H:%M"))

        over = client.post("/api/v1/reservations/", json={**body, "gpus": 7}, headers=headers)
        assert over.status_code == 409 and over.json()["errors"][0]["rule"] == "quota_exceeded", over.text
        unknown = client.post("/api/v1/reservations/", json={**body, "pool": "nope"}, headers=headers)
        assert unknown.status_code == 400 and unknown.json()["errors"][0] == {
            "field": "pool", "rule": "does_not_exist", "message": "There is no pool 'nope'."}

        released = client.post(f"/api/v1/reservations/{first.json()['id']}/release/", headers=headers)
        assert released.status_code == 200 and released.json()["state"] == "released", released.text
        assert [g["uuid"] for g in released.json()["allocated_gpus"]] == [
            g["uuid"] for g in first.json()["allocated_gpus"]]

        # The demo's history holds bob's past bookings too (config.demo_history): look at this test's own.
        listed = client.get("/api/v1/reservations/?limit=100", headers=headers).json()
        states = {r["id"]: r["state"] for r in listed["results"]}
        assert {i: states.get(i) for i in (first.json()["id"], second.json()["id"])} == {
            first.json()["id"]: "released", second.json()["id"]: "scheduled"}
        again = client.post("/api/v1/reservations/", json=body, headers=headers)
        assert again.status_code == 201, "the released GPUs are free again"


def test_the_embedded_server_counts_telemetry_it_stores_on_sqlite(embedded):
    """The ingest's INSERT on SQLite answers how many rows it stored: a GPU sent twice in one batch and a
    resent request count as duplicates, not as accepted."""
    import time
    import uuid as uuid_module

    base, passwords = embedded
    with httpx.Client(base_url=base, timeout=10) as client:
        token = client.post("/api/v1/auth/token/", json={"username": "admin", "password": passwords["admin"]}).json()
        created = client.post("/api/v1/host-tokens/", json={"cluster": "lab", "host_name": "gpu-l40s-01"},
                              headers={"Authorization": f"Token {token['token']}"})
        assert created.status_code == 201, created.text
        headers = {"Authorization": f"Host {created.json()['key']}"}
        gpu = f"GPU-{uuid_module.uuid5(uuid_module.NAMESPACE_DNS, 'gpu-l40s-01.demo.gpupool/0')}"
        one = {"uuid": gpu, "utilization_gpu_pct": 50, "memory_used_mib": 1000, "memory_total_mib": 46068,
               "temperature_c": 50}
        body = {"stream": "s", "batches": [{"seq": 1, "t": time.time(), "gpus": [one, {**one, "utilization_gpu_pct": 9}]}]}
        first = client.post("/api/v1/agent/telemetry/", json=body, headers=headers)
        assert first.status_code == 200, first.text
        assert first.json()["accepted"] == 1 and first.json()["rejected"] == {"duplicate": 1}
        again = client.post("/api/v1/agent/telemetry/", json={**body, "stream": "another-run"}, headers=headers)
        assert again.json()["accepted"] == 0 and again.json()["rejected"] == {"duplicate": 2}
