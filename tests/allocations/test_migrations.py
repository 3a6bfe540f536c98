"""The history indexes' migration: built (CONCURRENTLY on PostgreSQL, outside a transaction) and dropped again."""
from __future__ import annotations

import pytest
from django.db import connection
from django.db.migrations.executor import MigrationExecutor
from django.test.utils import CaptureQueriesContext

from tests.factories import window

HISTORY_INDEXES = {
    "allocations_allocation": {"allocation_window"},
    "allocations_reservation": {"reservation_team_pool_end", "reservation_team_newest", "reservation_team_ended"},
}


def indexes_present() -> dict[str, set[str]]:
    with connection.cursor() as cursor:
        return {table: names & set(connection.introspection.get_constraints(cursor, table))
                for table, names in HISTORY_INDEXES.items()}


def migrate(targets) -> None:
    executor = MigrationExecutor(connection)
    executor.migrate(targets)


@pytest.mark.django_db(transaction=True)
def test_the_history_indexes_migrate_both_ways():
    latest = MigrationExecutor(connection).loader.graph.leaf_nodes()
    try:
        migrate([("allocations", "0004_lease_failures")])
        assert indexes_present() == {table: set() for table in HISTORY_INDEXES}
        with CaptureQueriesContext(connection) as ran:
            migrate([("allocations", "0005_indexes_that_skip_history")])
        assert indexes_present() == HISTORY_INDEXES
        creates = [q["sql"] for q in ran.captured_queries if q["sql"].startswith("CREATE INDEX")]
        assert len(creates) == 4
        if connection.vendor == "postgresql":  # writes go on while they build
            assert all(sql.startswith("CREATE INDEX CONCURRENTLY") for sql in creates)
    finally:
        migrate(latest)


def _exclusion_constraints() -> set[str]:
    with connection.cursor() as cursor:
        cursor.execute("SELECT conname FROM pg_constraint WHERE conrelid = 'allocations_allocation'::regclass "
                       "AND contype = 'x'")
        return {name for (name,) in cursor.fetchall()}


def _insert(gpu_id: int, reservation_id: int, share: tuple[int, int] | None = None) -> None:
    from common import sql

    start, end = window(0, 1)
    columns, values = "reservation_id, gpu_id, starts_at, ends_at", "%s, %s, %s, %s"
    params = [reservation_id, gpu_id, sql.db_datetime(start), sql.db_datetime(end)]
    if share:
        columns, values = columns + ", share_from, share_to, milli", values + ", %s, %s, %s"
        params += [share[0], share[1], share[1] - share[0]]
    with connection.cursor() as cursor:
        cursor.execute(f"INSERT INTO allocations_allocation ({columns}) VALUES ({values})", params)


@pytest.mark.django_db(transaction=True)
def test_allocations_become_whole_gpu_grants_and_back_without_a_change_in_meaning(world, api):
    from django.db import IntegrityError, transaction

    from allocations.models import Allocation

    latest = MigrationExecutor(connection).loader.graph.leaf_nodes()
    booked = api(world.member).post("/api/v1/reservations/", {"pool": "a100", "team": "ml", "gpus": 2,
                                                              "ends_at": window(0, 2)[1].isoformat()}, format="json")
    assert booked.status_code == 201, booked.content
    rid = booked.json()["id"]
    gpu_ids = sorted(Allocation.objects.filter(reservation_id=rid).values_list("gpu_id", flat=True))
    try:
        migrate([("allocations", "0006_apply_job_lease")])
        with connection.cursor() as cursor:
            cursor.execute("SELECT count(*) FROM allocations_allocation WHERE reservation_id = %s", [rid])
            assert cursor.fetchone() == (2,)
        if connection.vendor == "postgresql":
            assert _exclusion_constraints() == {"allocation_no_overlap_on_gpu"}
        migrate(latest)
        rows = list(Allocation.objects.filter(reservation_id=rid).order_by("gpu_id")
                    .values_list("gpu_id", "share_from", "share_to", "milli", "mig_profile"))
        assert rows == [(gpu_id, 0, 1000, 1000, "") for gpu_id in gpu_ids]
        if connection.vendor != "postgresql":
            return
        assert _exclusion_constraints() == {"allocation_no_overlapping_share", "allocation_vgpu_apart"}
        # A whole card still refuses any other holder at the same time...
        with pytest.raises(IntegrityError), transaction.atomic():
            _insert(gpu_ids[0], rid, share=(500, 1000))
        # ...and on a free card two disjoint halves may overlap in time, two overlapping ones may not.
        free_gpu = world.pool.gpus.exclude(pk__in=gpu_ids).first().pk
        _insert(free_gpu, rid, share=(0, 500))
        _insert(free_gpu, rid, share=(500, 1000))
        with pytest.raises(IntegrityError), transaction.atomic():
            _insert(free_gpu, rid, share=(250, 750))
        Allocation.objects.filter(gpu_id=free_gpu).delete()
    finally:
        migrate(latest)


@pytest.mark.django_db
def test_a_grant_must_lie_inside_its_gpu(world, api):
    from django.db import IntegrityError, transaction

    booked = api(world.member).post("/api/v1/reservations/", {"pool": "a100", "team": "ml", "gpus": 1,
                                                              "ends_at": window(0, 2)[1].isoformat()}, format="json")
    rid = booked.json()["id"]
    free_gpu = world.pool.gpus.exclude(allocations__reservation_id=rid).first().pk
    for bad in ((0, 1001), (600, 600), (700, 300)):
        with pytest.raises(IntegrityError), transaction.atomic():
            _insert(free_gpu, rid, share=bad)


@pytest.mark.django_db(transaction=True)
def test_whole_gpu_quotas_become_ge_quotas_and_back_without_a_change_in_meaning(world, api):
    from allocations.models import Quota, Reservation

    latest = MigrationExecutor(connection).loader.graph.leaf_nodes()
    booked = api(world.member).post("/api/v1/reservations/", {"pool": "a100", "team": "ml", "gpus": 2,
                                                              "ends_at": window(0, 2)[1].isoformat()}, format="json")
    assert booked.status_code == 201, booked.content
    try:
        migrate([("allocations", "0008_teams_app"), ("inventory", "0005_gpu_models_and_mig_devices")])
        with connection.cursor() as cursor:
            cursor.execute("SELECT max_gpus, gpu_hours_per_month FROM allocations_quota q JOIN teams_team t "
                           "ON t.id = q.team_id WHERE t.slug = 'ml'")
            assert cursor.fetchone() == (6, None)
            cursor.execute("UPDATE allocations_quota SET gpu_hours_per_month = 120")
            # A reservation written by the release before: whole GPUs, no GE column yet.
            cursor.execute("SELECT count(*) FROM allocations_reservation")
            assert cursor.fetchone() == (1,)
        migrate(latest)
        quota = Quota.objects.get(team=world.team, pool=world.pool)
        assert (quota.max_ge, quota.ge_hours_per_month) == (6, 120)
        reservation = Reservation.objects.get()
        assert (reservation.mode, reservation.ge) == ("exclusive", 2.0)  # 2 GPUs of weight 1.0
        assert list(reservation.allocations.values_list("mode", "ge")) == [("exclusive", 1.0)] * 2
        # The same booking checks as before: 6 GE = 6 whole GPUs of weight 1.0.
        more = api(world.member).post("/api/v1/reservations/", {"pool": "a100", "team": "ml", "gpus": 5,
                                                                "ends_at": window(0, 2)[1].isoformat()}, format="json")
        assert more.status_code == 409 and more.json()["errors"][0]["rule"] == "quota_exceeded"
        Quota.objects.filter(pk=quota.pk).update(max_ge="4.5")
        migrate([("allocations", "0008_teams_app")])
        with connection.cursor() as cursor:
            cursor.execute("SELECT max_gpus, gpu_hours_per_month FROM allocations_quota WHERE id = %s", [quota.pk])
            max_gpus, hours = cursor.fetchone()
            assert (max_gpus, hours) in ((4, 120), (5, 120))  # back to whole numbers, as the column holds them
    finally:
        migrate(latest)
