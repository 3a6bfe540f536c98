"""DRF's plain-text tokens move into hashed API tokens, and their keys keep working."""
from __future__ import annotations

import pytest
from django.db import connection
from django.db.migrations.executor import MigrationExecutor
from rest_framework.test import APIClient

from common.secrets import key_digest
from teams.models import ApiToken
from tests.factories import UserFactory

OLD_KEY = "9944b09199c62bcf9418ad846dd0e4bbdfc6ee4b"  # DRF's shape: 40 hex characters

DRF_TABLE_DDL = """CREATE TABLE authtoken_token (
    "key" varchar(40) NOT NULL PRIMARY KEY,
    created timestamp with time zone NOT NULL,
    user_id integer NOT NULL UNIQUE REFERENCES auth_user (id) DEFERRABLE INITIALLY DEFERRED)"""


def migrate(targets) -> None:
    MigrationExecutor(connection).migrate(targets)


@pytest.mark.django_db(transaction=True)
def test_drf_tokens_become_hashed_api_tokens_that_keep_working_and_their_table_goes():
    latest = MigrationExecutor(connection).loader.graph.leaf_nodes()
    user = UserFactory(username="scripter")
    try:
        migrate([("portal", "0001_initial")])
        with connection.cursor() as cursor:
            cursor.execute(DRF_TABLE_DDL)
            cursor.execute("INSERT INTO authtoken_token (\"key\", created, user_id) VALUES (%s, %s, %s)",
                           [OLD_KEY, "2026-01-02T03:04:05+00:00", user.pk])
            cursor.execute("INSERT INTO django_migrations (app, name, applied) VALUES ('authtoken', '0001_initial', "
                           "'2026-01-02T03:04:05+00:00')")
        migrate(latest)
    finally:
        migrate(latest)
        with connection.cursor() as cursor:
            cursor.execute("DROP TABLE IF EXISTS authtoken_token")
    assert "authtoken_token" not in connection.introspection.table_names()
    token = ApiToken.objects.get(user=user)
    assert (token.prefix, token.digest) == (OLD_KEY[:12], key_digest(OLD_KEY))
    assert token.created_at.year == 2026 and token.created_at.month == 1
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM django_migrations WHERE app = 'authtoken'")
        assert cursor.fetchone()[0] == 0
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {OLD_KEY}")
    assert client.get("/api/v1/reservations/").status_code == 200
