"""Production settings: `manage.py check --deploy` is clean, and HTTPS=true sends HSTS and redirects plain HTTP."""
from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys

import pytest

from tests.conftest import BASE_DIR

HOST = "portal.example.org"


def _production_env(**extra) -> dict[str, str]:
    env = {key: value for key, value in os.environ.items()
           if key not in ("DEBUG", "METRICS_PUBLIC") and not key.startswith("SECURE_")}
    env.update(DJANGO_SETTINGS_MODULE="config.settings", REDIS_URL=os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/4"),
               DATABASE_URL=os.environ.get("DATABASE_URL", "postgres://gpupool:gpupool@127.0.0.1:5432/gpupool"),
               SECRET_KEY=secrets.token_urlsafe(50), ALLOWED_HOSTS=HOST, HTTPS="true",
               METRICS_TOKEN=secrets.token_urlsafe(32))
    env.update(extra)
    return {key: value for key, value in env.items() if value is not None}


@pytest.fixture
def test_database_url(db) -> str:
    """The suite's (migrated) test database, for a process of its own to read; /metrics reads the fleet."""
    from django.db import connection

    if connection.vendor != "postgresql":
        pytest.skip("needs the suite's PostgreSQL")
    db = connection.settings_dict
    return f"postgres://{db['USER']}:{db['PASSWORD']}@{db['HOST']}:{db['PORT']}/{db['NAME']}"


@pytest.fixture(scope="module", autouse=True)
def collected_static(tmp_path_factory):
    """Production runs collectstatic with each release: the processes here see a collected folder."""
    folder = tmp_path_factory.mktemp("static")
    env = dict(os.environ, STATIC_ROOT=str(folder), SECRET_KEY="collect-only")
    subprocess.run([sys.executable, "manage.py", "collectstatic", "--noinput", "-v0"], cwd=BASE_DIR, env=env,
                   check=True, timeout=300)
    before = os.environ.get("STATIC_ROOT")
    os.environ["STATIC_ROOT"] = str(folder)
    yield folder
    if before is None:
        os.environ.pop("STATIC_ROOT", None)
    else:
        os.environ["STATIC_ROOT"] = before


def _check_deploy(env) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "manage.py", "check", "--deploy", "--fail-level", "WARNING"], cwd=BASE_DIR,
                          env=env, capture_output=True, text=True, timeout=120)


def test_check_deploy_is_clean_in_production_settings():
    done = _check_deploy(_production_env())
    assert done.returncode == 0, done.stderr
    assert "no issues" in done.stdout


def test_check_deploy_says_when_static_files_were_not_collected(tmp_path):
    done = _check_deploy(_production_env(STATIC_ROOT=str(tmp_path)))
    assert done.returncode != 0 and "portal.W002" in done.stderr and "collectstatic" in done.stderr


def test_check_deploy_names_what_production_settings_miss_without_https_and_a_metrics_token():
    done = _check_deploy(_production_env(HTTPS=None, METRICS_TOKEN=None))
    assert done.returncode != 0
    for check in ("security.W004", "security.W008", "security.W012", "security.W016", "portal.W001"):
        assert check in done.stderr, done.stderr


RESPONSES = """
import json, django
django.setup()
from django.test import Client
client = Client(HTTP_HOST="%s")
secure = client.get("/healthz", HTTP_X_FORWARDED_PROTO="https")
plain_page = client.get("/login/")
plain_probes = [client.get(path).status_code for path in ("/healthz", "/metrics")]
print(json.dumps({"hsts": secure.get("Strict-Transport-Security"), "plain_hsts": plain_page.get("Strict-Transport-Security"),
                  "page": [plain_page.status_code, plain_page.get("Location")], "probes": plain_probes}))
""" % HOST


@pytest.mark.parametrize("extra, hsts", [
    ({}, "max-age=31536000; includeSubDomains"),
    ({"SECURE_HSTS_SECONDS": "600", "SECURE_HSTS_INCLUDE_SUBDOMAINS": "false"}, "max-age=600"),
])
def test_https_answers_carry_hsts_and_plain_http_is_redirected_except_probes(extra, hsts, test_database_url):
    env = _production_env(METRICS_TOKEN=None, METRICS_PUBLIC="true", DATABASE_URL=test_database_url, **extra)
    done = subprocess.run([sys.executable, "-c", RESPONSES], cwd=BASE_DIR, env=env, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen["hsts"] == hsts
    assert seen["plain_hsts"] is None  # browsers ignore HSTS sent over plain HTTP; Django does not send it
    assert seen["page"] == [301, f"https://{HOST}/login/"]
    assert seen["probes"] == [200, 200]  # kubelet and in-cluster scrapers talk plain HTTP to the pod


def test_ssl_redirect_can_be_left_to_the_ingress(test_database_url):
    env = _production_env(SECURE_SSL_REDIRECT="false", DATABASE_URL=test_database_url)
    done = _check_deploy(env)
    assert done.returncode == 0, done.stderr
    env["METRICS_PUBLIC"] = "true"
    seen = subprocess.run([sys.executable, "-c", RESPONSES], cwd=BASE_DIR, env=env, capture_output=True, text=True,
                          timeout=120)
    assert json.loads(seen.stdout.strip().splitlines()[-1])["page"][0] == 200
