"""The teams' models moved from `portal` to `teams` (tables renamed, state moved): a database of the release
before keeps its teams, members, tokens, reservations and admin permissions, and can go back."""
from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
from contextlib import closing

import pytest
from django.contrib.auth.models import Permission
from django.contrib.contenttypes.models import ContentType
from django.db import connection
from django.db.migrations.executor import MigrationExecutor
from django.db.migrations.loader import MigrationLoader
from django.test import Client
from rest_framework.test import APIClient

from common.secrets import key_digest, key_prefix, new_key
from teams.models import ApiToken, Membership, Team
from tests.conftest import BASE_DIR
from tests.factories import UserFactory, window

MOVED = ("team", "membership", "apitoken")


def migrate(targets) -> None:
    MigrationExecutor(connection).migrate(targets)


def tables() -> set[str]:
    return set(connection.introspection.table_names())


def state_as_applied():
    """The historical models of what the database holds now (the release before, once `teams` is unapplied)."""
    loader = MigrationLoader(connection)
    return loader.project_state(list(loader.applied_migrations)).apps


@pytest.mark.django_db(transaction=True)
def test_a_database_of_the_release_before_keeps_its_teams_tokens_and_reservations(world, api):
    latest = MigrationExecutor(connection).loader.graph.leaf_nodes()
    booked = api(world.member).post("/api/v1/reservations/", {"pool": "a100", "team": "ml", "gpus": 2,
                                                              "ends_at": window(0, 2)[1].isoformat()}, format="json")
    assert booked.status_code == 201, booked.content
    scripter = UserFactory(username="scripter")
    auditor = UserFactory(username="auditor", is_staff=True)
    key = new_key()
    try:
        # Back to the release before: the portal app's tables, as it left them.
        migrate([("teams", None)])
        assert {"portal_team", "portal_membership", "portal_apitoken"} <= tables()
        assert not {"teams_team", "teams_membership", "teams_apitoken"} & tables()

        # What that release's code wrote: a team, its member, a token, a reservation, a permission.
        old = state_as_applied()
        legacy = old.get_model("portal", "Team").objects.create(slug="legacy", name="Legacy")
        old.get_model("portal", "Membership").objects.create(user_id=scripter.pk, team_id=legacy.pk, role="manager")
        old.get_model("portal", "ApiToken").objects.create(user_id=scripter.pk, name="ci", prefix=key_prefix(key),
                                                          digest=key_digest(key))
        old.get_model("allocations", "Quota").objects.create(team_id=legacy.pk, pool_id=world.other_pool.pk,
                                                             max_gpus=1)  # that release named the column max_gpus
        starts_at, ends_at = window(0, 3)
        reservation = old.get_model("allocations", "Reservation").objects.create(
            team_id=legacy.pk, pool_id=world.other_pool.pk, requested_by_id=scripter.pk, gpus=1,
            starts_at=starts_at, ends_at=ends_at, state="scheduled")
        gpu = world.other_pool.gpus.order_by("pk").first()
        old.get_model("allocations", "Allocation").objects.create(reservation_id=reservation.pk, gpu_id=gpu.pk,
                                                                  starts_at=starts_at, ends_at=ends_at)
        old_type = old.get_model("contenttypes", "ContentType").objects.get(app_label="portal", model="team")
        view_team = old.get_model("auth", "Permission").objects.get(content_type=old_type, codename="view_team")
        old.get_model("auth", "User").objects.get(pk=auditor.pk).user_permissions.add(view_team)
    finally:
        migrate(latest)
    ContentType.objects.clear_cache()

    assert {"teams_team", "teams_membership", "teams_apitoken"} <= tables()
    assert not {"portal_team", "portal_membership", "portal_apitoken"} & tables()
    assert Membership.objects.get(team__slug="legacy").user == scripter
    assert ApiToken.objects.get(user=scripter).name == "ci"

    # The old token still authenticates and the old reservation still lists, beside the one booked before.
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {key}")
    listed = client.get("/api/v1/reservations/")
    assert listed.status_code == 200, listed.content
    assert [(r["id"], r["team"]) for r in listed.json()["results"]] == [(reservation.pk, "legacy")]
    mine = api(world.member).get("/api/v1/reservations/").json()["results"]
    assert [r["id"] for r in mine] == [booked.json()["id"]]

    # The content types moved with the models (same rows), so permissions granted before still hold.
    moved = ContentType.objects.filter(app_label__in=("portal", "teams"), model__in=MOVED)
    assert sorted(moved.values_list("app_label", "model")) == sorted(("teams", m) for m in MOVED)
    assert ContentType.objects.get_for_model(Team).pk == old_type.pk
    assert Permission.objects.get(codename="view_team").content_type.app_label == "teams"
    browser = Client()
    browser.force_login(auditor)
    page = browser.get("/admin/teams/team/")
    assert page.status_code == 200 and b"Legacy" in page.content


@pytest.mark.django_db(transaction=True)
def test_going_back_gives_the_tables_and_content_types_back_to_portal(world):
    latest = MigrationExecutor(connection).loader.graph.leaf_nodes()
    ContentType.objects.get_for_model(Team)
    try:
        migrate([("teams", None)])
        assert {"portal_team", "portal_membership", "portal_apitoken"} <= tables()
        with connection.cursor() as cursor:
            cursor.execute("SELECT slug FROM portal_team ORDER BY slug")
            assert [slug for (slug,) in cursor.fetchall()] == ["infra", "ml"]
        old = state_as_applied()
        assert old.get_model("contenttypes", "ContentType").objects.filter(app_label="portal", model="team").exists()
        # The three moved models go back; content types of models added later (GroupMapping) stay, as Django
        # leaves every stale content type until remove_stale_contenttypes.
        assert not old.get_model("contenttypes", "ContentType").objects.filter(app_label="teams", model__in=MOVED).exists()
    finally:
        migrate(latest)
    assert sorted(Team.objects.values_list("slug", flat=True)) == ["infra", "ml"]


def test_a_fresh_sqlite_database_migrates_with_every_key_pointing_at_the_teams_tables(tmp_path):
    database = tmp_path / "fresh.sqlite3"
    env = dict(os.environ, DATABASE_URL=f"sqlite:///{database}", PORTAL_VAR_DIR=str(tmp_path))
    env.pop("REDIS_URL", None)
    migrated = subprocess.run([sys.executable, "manage.py", "migrate", "--no-input"], cwd=BASE_DIR, env=env,
                              capture_output=True, text=True, timeout=180)
    assert migrated.returncode == 0, migrated.stdout[-2000:] + migrated.stderr[-3000:]
    with closing(sqlite3.connect(database)) as db:
        schema = "\n".join(sql for (sql,) in db.execute("SELECT sql FROM sqlite_master WHERE sql IS NOT NULL"))
        assert 'REFERENCES "portal_' not in schema
        assert 'REFERENCES "teams_team"' in schema
        assert db.execute("PRAGMA foreign_key_check").fetchall() == []
        assert sorted(db.execute("SELECT app_label, model FROM django_content_type WHERE model IN "
                                 "('team', 'membership', 'apitoken')")) == sorted(("teams", m) for m in MOVED)
