"""The README's backup and restore, end to end: pg_dump the portal's database, let the world move on
(a team booked after the backup, a quota changed on the cluster), pg_restore into a fresh database,
start the portal on it, and let one reconcile bring the cluster back into line with what was restored."""
from __future__ import annotations

import os
import subprocess
import sys
import uuid

import httpx
import psycopg
import pytest
from django.db import connection

from allocations.apply import jobs
from teams.services import api_token_create
from tests.conftest import BASE_DIR, free_port, healthz_answers, start_server, stop_process_group
from tests.factories import MembershipFactory, UserFactory
from tests.kubernetes.conftest import active_reservation


def _url(name: str) -> str:
    db = connection.settings_dict
    return f"postgres://{db['USER']}:{db['PASSWORD']}@{db['HOST']}:{db['PORT']}/{name}"


@pytest.fixture
def restored_database():
    """The name of a database to restore into, dropped afterwards."""
    name = f"gpupool_restored_{uuid.uuid4().hex[:8]}"
    yield name
    with psycopg.connect(_url("postgres"), autocommit=True) as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def _hard(core, namespace: str) -> dict:
    return core.read_namespaced_resource_quota("gpupool", namespace).spec.hard


def test_a_restored_backup_serves_and_the_reconcile_brings_the_cluster_back_into_line(
        transactional_db, kube_cluster, core, tmp_path, restored_database, settings):
    team, kept, namespace = active_reservation(kube_cluster, "backup")
    user = UserFactory(username=f"u-{uuid.uuid4().hex[:6]}")
    MembershipFactory(user=user, team=team)
    _, key = api_token_create(user=user, name="before the backup")
    jobs.cluster_reconcile(cluster_id=kube_cluster.pk)
    assert _hard(core, namespace) == {"requests.nvidia.com/gpu": "2"}

    # The README's backup command.
    dump = tmp_path / "gpupool.dump"
    subprocess.run(["pg_dump", "--format=custom", "--no-owner", f"--file={dump}",
                    _url(connection.settings_dict["NAME"])], check=True)

    # After the backup: another team books, and the first team's quota changes on the cluster.
    _, later, later_namespace = active_reservation(kube_cluster, "after")
    jobs.cluster_reconcile(cluster_id=kube_cluster.pk)
    core.patch_namespaced_resource_quota("gpupool", namespace, {"spec": {"hard": {"requests.nvidia.com/gpu": "3"}}})
    assert _hard(core, later_namespace) == {"requests.nvidia.com/gpu": "2"}

    # The README's restore: a fresh database, pg_restore, migrate (nothing to do for the same release).
    with psycopg.connect(_url("postgres"), autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{restored_database}"')
    subprocess.run(["pg_restore", "--no-owner", "--exit-on-error", f"--dbname={_url(restored_database)}", str(dump)],
                   check=True)
    env = dict(os.environ, DATABASE_URL=_url(restored_database), REDIS_URL=settings.REDIS_URL,
               PORTAL_VAR_DIR=str(tmp_path), PYTHONUNBUFFERED="1")
    migrate = subprocess.run([sys.executable, "manage.py", "migrate", "--noinput"], cwd=BASE_DIR, env=env,
                             capture_output=True, text=True, check=True)
    assert "No migrations to apply." in migrate.stdout

    # The portal starts on the restored database and knows what was booked before the backup only.
    port = free_port()
    base_url = f"http://127.0.0.1:{port}"
    web = start_server([sys.executable, "-m", "config.web", "--port", str(port), "--workers", "1"], env=env,
                       log_path=tmp_path / "web.log", ready=healthz_answers(base_url), what="the web process")
    try:
        assert httpx.get(f"{base_url}/readyz", timeout=5).json()["status"] == "ok"
        listed = httpx.get(f"{base_url}/api/v1/reservations/", headers={"Authorization": f"Token {key}"}, timeout=10)
        assert listed.status_code == 200
        ids = {item["id"] for item in listed.json()["results"]}
        assert kept.pk in ids and later.pk not in ids
    finally:
        stop_process_group(web)

    # One reconcile (beat runs it every RECONCILE_SECONDS) puts the cluster back to the restored state:
    # the first team's quota as restored, the team the backup never knew of at zero.
    reconcile = subprocess.run(
        [sys.executable, "manage.py", "shell", "-c",
         "from allocations.tasks import reconcile_clusters; import json; print(json.dumps(reconcile_clusters()))"],
        cwd=BASE_DIR, env=env, capture_output=True, text=True, timeout=120)
    assert reconcile.returncode == 0, reconcile.stderr[-3000:]
    assert _hard(core, namespace) == {"requests.nvidia.com/gpu": "2"}
    assert _hard(core, later_namespace) == {"requests.nvidia.com/gpu": "0"}
