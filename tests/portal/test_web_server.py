"""`python -m portal.web`, the Procfile's web process: Granian serving the WSGI app."""
from __future__ import annotations

import os
import subprocess
import sys

import httpx

from tests.conftest import BASE_DIR, free_port, healthz_answers, start_server, stop_process_group


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
