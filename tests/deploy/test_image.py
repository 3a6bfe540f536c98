"""The container image (Containerfile) builds here, runs as its own unprivileged user, and its web process
answers /readyz against this machine's PostgreSQL and Redis (scripts/build-image --smoke).

There is no container registry here, so the script makes the base from Debian packages (mmdebstrap)
and PyPI is reached through the machine's proxy; both are what a site without a registry would do.
"""
from __future__ import annotations

import json
import os
import subprocess
import uuid
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import psycopg
import pytest

from tests.conftest import free_port

BASE_DIR = Path(__file__).resolve().parents[2]
IMAGE = "localhost/gpupool-portal:test"


@pytest.fixture
def scratch_database():
    """A database of its own for the container's migrate job, dropped afterwards."""
    url = urlsplit(os.environ["DATABASE_URL"])
    name = f"gpupool_image_{uuid.uuid4().hex[:8]}"
    admin = urlunsplit(url._replace(path="/postgres"))
    with psycopg.connect(admin, autocommit=True) as connection:
        connection.execute(f'CREATE DATABASE "{name}"')
    yield urlunsplit(url._replace(path=f"/{name}"))
    with psycopg.connect(admin, autocommit=True) as connection:
        connection.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def test_the_image_builds_and_its_web_process_answers_readyz(scratch_database):
    env = {**os.environ, "IMAGE": IMAGE, "SMOKE_DATABASE_URL": scratch_database,
           "SMOKE_REDIS_URL": os.environ["REDIS_URL"], "SMOKE_PORT": str(free_port())}
    smoke = subprocess.run([str(BASE_DIR / "scripts" / "build-image"), "--smoke"], cwd=BASE_DIR, env=env,
                           capture_output=True, text=True, timeout=1500)
    assert smoke.returncode == 0, smoke.stderr[-4000:]
    assert json.loads(smoke.stdout.strip().splitlines()[-1]) == {"status": "ok", "database": "ok", "broker": "ok"}

    (image,) = json.loads(subprocess.run(["podman", "image", "inspect", IMAGE], capture_output=True, text=True,
                                         check=True).stdout)
    assert image["Config"]["User"] == "10001"
    assert image["Config"]["Entrypoint"] == ["/app/deploy/entrypoint"] and image["Config"]["Cmd"] == ["web"]
    assert "/healthz" in " ".join(image["Healthcheck"]["Test"])  # kept: built in Docker format
    # The migrate job ran the project's migrations in the scratch database.
    with psycopg.connect(scratch_database) as connection:
        applied = connection.execute("SELECT count(*) FROM django_migrations WHERE app = 'teams'").fetchone()[0]
    assert applied == len(list((BASE_DIR / "teams" / "migrations").glob("0*.py")))
