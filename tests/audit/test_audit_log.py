"""The audit log: every change by a person or the system is an entry (who, when, from where, the object,
its fields before and after); entries are never changed or deleted but by the retention; staff read them
through the API, the page and the admin."""
from __future__ import annotations

import json
from datetime import timedelta
from datetime import timezone as dt_timezone
from decimal import Decimal

import pytest
from django.contrib.contenttypes.models import ContentType
from django.db import DatabaseError, connection, transaction
from django.test import Client
from django.utils import timezone
from django.utils.dateparse import parse_datetime

from allocations.models import PriorityClass, Quota, Reservation, ReservationEvent
from audit.models import AppendOnly, AuditEntry
from audit.services import audit_entries_delete_expired
from audit.tasks import delete_expired_audit_entries
from inventory import services as inventory_services
from inventory.models import Cluster, Gpu, GpuModel, HostToken, Node
from monitoring.models import AlertRule, Silence
from teams.models import ApiToken, Membership, Team
from tests.allocations.test_reservation_lifecycle import reserve
from tests.factories import PASSWORD, ClusterFactory, NodeFactory, UserFactory

pytestmark = pytest.mark.django_db

KUBECONFIG_TOKEN = "s3cr3t-kube-token-value"
KUBECONFIG = f"""apiVersion: v1
kind: Config
clusters: [{{name: c, cluster: {{server: "https://k8s.example:6443"}}}}]
users: [{{name: u, user: {{token: {KUBECONFIG_TOKEN}}}}}]
contexts: [{{name: x, context: {{cluster: c, user: u}}}}]
current-context: x
"""


def entries_for(model, object_id=None):
    entries = AuditEntry.objects.filter(content_type=ContentType.objects.get_for_model(model))
    if object_id is not None:
        entries = entries.filter(object_id=object_id)
    return list(entries.order_by("timestamp", "id"))


def last_entry(model, object_id=None) -> AuditEntry:
    found = entries_for(model, object_id)
    assert found, f"no audit entry for {model.__name__} {object_id}"
    return found[-1]


def everything_logged() -> str:
    return json.dumps([[e.object_repr, e.changes, e.additional_data, e.changes_text]
                       for e in AuditEntry.objects.all()], default=str)


# --- each kind of change, with its actor and source ----------------------------------------------

def test_a_quota_change_through_the_api_records_actor_source_and_before_after(world, api):
    quota = Quota.objects.get(team=world.team, pool=world.pool)
    response = api(world.staff).patch(f"/api/v1/quotas/{quota.pk}/", {"max_ge": 7}, format="json")
    assert response.status_code == 200, response.content
    entry = last_entry(Quota, quota.pk)
    assert (entry.action, entry.source, entry.actor_label, entry.actor_id) == (
        AuditEntry.Action.UPDATE, "api", "staff", world.staff.pk)
    before, after = entry.changes["max_ge"]
    assert (Decimal(str(before)), Decimal(str(after))) == (Decimal(6), Decimal(7))
    assert "updated_at" not in entry.changes


def test_a_gpu_model_weight_change_is_recorded(world, api):
    from urllib.parse import quote

    name = Gpu.objects.first().model_name
    response = api(world.staff).patch(f"/api/v1/gpu-models/{quote(name)}/", {"weight": 0.6}, format="json")
    assert response.status_code == 200, response.content
    entry = last_entry(GpuModel)
    assert entry.object_repr.startswith(name) or name in entry.object_repr
    assert Decimal(str(entry.changes["weight"][1])) == Decimal("0.6")
    assert (entry.source, entry.actor_label) == ("api", "staff")


def test_priority_classes_are_recorded_created_changed_and_deleted(world, api):
    client = api(world.staff)
    created = client.post("/api/v1/priority-classes/", {"name": "urgent", "value": 50}, format="json")
    assert created.status_code == 201, created.content
    pk = created.json()["id"]
    assert client.patch("/api/v1/priority-classes/urgent/", {"value": 60}, format="json").status_code == 200
    assert client.delete("/api/v1/priority-classes/urgent/").status_code == 204
    actions = [(e.action, e.changes.get("value")) for e in entries_for(PriorityClass, pk)]
    assert actions == [(AuditEntry.Action.CREATE, [None, 50]), (AuditEntry.Action.UPDATE, [50, 60]),
                       (AuditEntry.Action.DELETE, [60, None])]


def test_teams_memberships_and_roles_are_recorded(world, api):
    client = api(world.staff)
    created = client.post("/api/v1/teams/", {"slug": "audio", "name": "Audio"}, format="json")
    assert created.status_code == 201, created.content
    team = Team.objects.get(slug="audio")
    assert last_entry(Team, team.pk).changes["slug"] == [None, "audio"]

    newcomer = UserFactory(username="newcomer")
    assert client.post("/api/v1/teams/audio/members/", {"username": "newcomer"}, format="json").status_code == 201
    membership = Membership.objects.get(team=team, user=newcomer)
    assert last_entry(Membership, membership.pk).action == AuditEntry.Action.CREATE
    changed = client.patch("/api/v1/teams/audio/members/newcomer/", {"role": "manager"}, format="json")
    assert changed.status_code == 200, changed.content
    assert last_entry(Membership, membership.pk).changes["role"] == ["member", "manager"]
    assert client.delete("/api/v1/teams/audio/members/newcomer/").status_code == 204
    removed = last_entry(Membership, membership.pk)
    assert (removed.action, removed.actor_label, removed.source) == (AuditEntry.Action.DELETE, "staff", "api")


def test_a_pool_and_its_sharing_mode_are_recorded(world, api):
    client = api(world.staff)
    created = client.post("/api/v1/pools/", {"slug": "ts", "name": "TS", "sharing_mode": "time_slicing",
                                             "sharing_config": {"replicas": 4}}, format="json")
    assert created.status_code == 201, created.content
    entry = last_entry(type(world.pool), created.json()["id"])
    assert entry.changes["sharing_mode"] == [None, "time_slicing"]
    assert entry.changes["sharing_config"][1] == {"replicas": 4}
    assert client.patch("/api/v1/pools/ts/", {"placement_policy": "best_fit"}, format="json").status_code == 200
    assert list(last_entry(type(world.pool), created.json()["id"]).changes) == ["placement_policy"]


def test_nodes_and_gpus_changed_through_the_api_are_recorded(world, api):
    client = api(world.staff)
    node = Node.objects.get(name="node-a")
    assert client.patch(f"/api/v1/nodes/{node.pk}/", {"schedulable": False}, format="json").status_code == 200
    assert last_entry(Node, node.pk).changes == {"schedulable": [True, False]}
    gpu = node.gpus.first()
    assert client.patch(f"/api/v1/gpus/{gpu.pk}/", {"healthy": False}, format="json").status_code == 200
    assert last_entry(Gpu, gpu.pk).changes == {"healthy": [True, False]}


def test_a_cluster_is_recorded_without_its_kubeconfig(world, api):
    response = api(world.staff).post("/api/v1/clusters/", {"name": "k8s", "kind": "kubernetes",
                                                           "kubeconfig": KUBECONFIG}, format="json")
    assert response.status_code == 201, response.content
    cluster = Cluster.objects.get(name="k8s")
    assert cluster.kubeconfig_encrypted  # a secret was stored...
    entry = last_entry(Cluster, cluster.pk)
    assert entry.changes["name"] == [None, "k8s"]
    logged = everything_logged()
    # ...and neither it nor its ciphertext reaches the log
    assert KUBECONFIG_TOKEN not in logged and cluster.kubeconfig_encrypted not in logged
    assert "kubeconfig_encrypted" not in logged and "prometheus_auth_encrypted" not in logged


def test_api_tokens_are_recorded_created_and_revoked_never_their_value(world, api):
    created = api().post("/api/v1/auth/token/", {"username": "member", "password": PASSWORD, "name": "ci"},
                         format="json")
    assert created.status_code == 200, created.content
    key = created.json()["token"]
    token = ApiToken.objects.get(user=world.member, name="ci")
    entry = last_entry(ApiToken, token.pk)
    assert (entry.action, entry.source, entry.actor_label) == (AuditEntry.Action.CREATE, "api", "member")
    assert entry.changes["name"] == [None, "ci"]
    revoked = api().delete("/api/v1/auth/token/", HTTP_AUTHORIZATION=f"Token {key}")
    assert revoked.status_code == 204, revoked.content
    gone = last_entry(ApiToken, token.pk)
    # The token itself signed the revoke: DRF authenticated it in the view, after the middleware ran.
    assert (gone.action, gone.actor_label, gone.source) == (AuditEntry.Action.DELETE, "member", "api")
    logged = everything_logged()
    assert key not in logged and token.digest not in logged and "digest" not in logged


def test_host_tokens_are_recorded_never_their_key(world, api):
    ClusterFactory(slug="lab", name="lab")
    client = api(world.staff)
    created = client.post("/api/v1/host-tokens/", {"cluster": "lab", "host_name": "gpu-07"}, format="json")
    assert created.status_code == 201, created.content
    token = HostToken.objects.get(host_name="gpu-07")
    assert last_entry(HostToken, token.pk).action == AuditEntry.Action.CREATE
    assert client.post(f"/api/v1/host-tokens/{token.pk}/revoke/").status_code in (200, 204)
    assert last_entry(HostToken, token.pk).changes["revoked_at"][0] is None
    logged = everything_logged()
    assert created.json()["key"] not in logged and token.key_hash not in logged


def test_alert_rules_and_silences_are_recorded(world, api):
    client = api(world.staff)
    rule = client.post("/api/v1/alert-rules/", {"name": "Hot", "metric": "gpu_temperature", "scope": "gpu",
                                                "comparison": ">=", "threshold": 80}, format="json")
    assert rule.status_code == 201, rule.content
    assert last_entry(AlertRule, rule.json()["id"]).changes["threshold"] == [None, 80.0]
    start = timezone.now()
    silence = client.post("/api/v1/silences/", {"rule": rule.json()["id"], "comment": "maintenance",
                                                "starts_at": start.isoformat(),
                                                "ends_at": (start + timedelta(hours=1)).isoformat()}, format="json")
    assert silence.status_code == 201, silence.content
    entry = last_entry(Silence, silence.json()["id"])
    assert entry.changes["comment"] == [None, "maintenance"] and entry.actor_label == "staff"


def test_reservation_transitions_are_in_the_log_and_point_at_their_events(world, api):
    client = api(world.member)
    made = reserve(client, hours_from_now=24)
    assert client.post(f"/api/v1/reservations/{made['id']}/release/").status_code == 200
    entries = entries_for(Reservation, made["id"])
    events = list(ReservationEvent.objects.filter(reservation_id=made["id"]).order_by("id"))
    assert [e.changes["state"] for e in entries] == [[ev.from_state or None, ev.to_state] for ev in events]
    assert [e.additional_data["reservation_event"] for e in entries] == [ev.pk for ev in events]
    assert {(e.actor_label, e.source) for e in entries} == {("member", "api")}
    assert entries[0].action == AuditEntry.Action.CREATE


def test_an_extension_records_the_new_end_beside_its_event(world, api):
    client = api(world.member)
    made = reserve(client, hours_from_now=24)
    old_end = Reservation.objects.get(pk=made["id"]).ends_at
    new_end = old_end + timedelta(hours=1)
    response = client.post(f"/api/v1/reservations/{made['id']}/extend/", {"ends_at": new_end.isoformat()},
                           format="json")
    assert response.status_code == 200, response.content
    saved = [e for e in entries_for(Reservation, made["id"]) if "ends_at" in e.changes]
    assert len(saved) == 1 and saved[0].actor_label == "member"
    # django-auditlog writes datetimes in UTC without the offset
    before, after = (parse_datetime(value).replace(tzinfo=dt_timezone.utc) for value in saved[0].changes["ends_at"])
    assert (before, after) == (old_end, new_end)


def test_a_change_in_the_django_admin_is_recorded_with_source_admin(world):
    client = Client()
    client.force_login(world.staff)
    response = client.post("/admin/allocations/priorityclass/add/", {"name": "batch", "value": 5,
                                                                     "description": "overnight"})
    assert response.status_code == 302, response.content[:2000]
    pc = PriorityClass.objects.get(name="batch")
    entry = last_entry(PriorityClass, pc.pk)
    assert (entry.source, entry.actor_label, entry.changes["value"]) == ("admin", "staff", [None, 5])
    # Its own fields only: not its id, nor its reverse relations (quotas), which read "allocations.Quota.None"
    assert set(entry.changes) == {"name", "value", "description", "preemptible"}


def test_a_change_on_a_page_is_recorded_with_source_page(world):
    client = Client()
    client.force_login(world.owner)
    response = client.post("/teams/ml/", {"action": "add", "username": "outsider", "role": "member"})
    membership = Membership.objects.filter(team=world.team, user=world.outsider).first()
    assert membership is not None, response.content[:2000]
    entry = last_entry(Membership, membership.pk)
    assert (entry.source, entry.actor_label) == ("page", "owner")


def test_the_system_is_the_actor_of_what_a_task_changes(world):
    node = Node.objects.get(name="node-c")
    Node.objects.filter(pk=node.pk).update(cluster=ClusterFactory(slug="metal"), last_seen_at=timezone.now() - timedelta(hours=1))
    from inventory.tasks import mark_silent_hosts

    mark_silent_hosts.apply()
    node.refresh_from_db()
    assert not node.healthy
    entry = last_entry(Node, node.pk)
    assert (entry.changes, entry.actor_id, entry.actor_label, entry.source) == (
        {"healthy": [True, False]}, None, "system", "system")
    assert entry.additional_data["task"] == "inventory.tasks.mark_silent_hosts"


def test_a_host_coming_back_is_recorded_once_not_every_heartbeat(world):
    cluster = ClusterFactory(slug="metal")
    node = NodeFactory(cluster=cluster, name="gpu-01", healthy=False)
    token, _key = inventory_services.host_token_create(actor=world.staff, cluster=cluster, host_name="gpu-01")
    for _ in range(3):
        inventory_services.host_heartbeat(token=token)
    changes = [e.changes for e in entries_for(Node, node.pk) if e.action == AuditEntry.Action.UPDATE]
    assert changes == [{"healthy": [False, True]}]


# --- append-only ---------------------------------------------------------------------------------

def _an_entry(world, **fields) -> AuditEntry:
    return AuditEntry.objects.create(content_type=ContentType.objects.get_for_model(Team), object_pk=str(world.team.pk),
                                     object_id=world.team.pk, object_repr="ml", action=AuditEntry.Action.UPDATE,
                                     changes={"name": ["ML", "Machine learning"]}, **fields)


def test_the_application_refuses_to_change_or_delete_an_entry(world):
    entry = _an_entry(world)
    entry.object_repr = "forged"
    with pytest.raises(AppendOnly):
        entry.save()
    with pytest.raises(AppendOnly):
        entry.delete()
    with pytest.raises(AppendOnly):
        AuditEntry.objects.filter(pk=entry.pk).update(object_repr="forged")
    with pytest.raises(AppendOnly):
        AuditEntry.objects.filter(pk=entry.pk).delete()


@pytest.mark.parametrize("statement", [
    "UPDATE audit_auditentry SET object_repr = 'forged' WHERE id = %s",
    "DELETE FROM audit_auditentry WHERE id = %s",
])
def test_postgresql_refuses_an_update_or_delete_of_an_entry(world, statement):
    if connection.vendor != "postgresql":
        pytest.skip("the trigger is PostgreSQL's")
    entry = _an_entry(world, timestamp=timezone.now() - timedelta(days=1000))
    with pytest.raises(DatabaseError, match="append-only"), transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(statement, [entry.pk])
    assert AuditEntry.objects.get(pk=entry.pk).object_repr == "ml"


def test_postgresql_lets_the_retention_setting_delete_only_entries_past_it(world):
    if connection.vendor != "postgresql":
        pytest.skip("the trigger is PostgreSQL's")
    recent = _an_entry(world, timestamp=timezone.now() - timedelta(days=10))
    old = _an_entry(world, timestamp=timezone.now() - timedelta(days=500))
    with pytest.raises(DatabaseError, match="append-only"), transaction.atomic(), connection.cursor() as cursor:
        # Even code that sets the retention variable cannot delete an entry younger than it.
        cursor.execute("SELECT set_config('audit.retention_days', '400', true)")
        cursor.execute("DELETE FROM audit_auditentry WHERE id = %s", [recent.pk])
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("SELECT set_config('audit.retention_days', '400', true)")
        cursor.execute("DELETE FROM audit_auditentry WHERE id = %s", [old.pk])
    assert list(AuditEntry.objects.filter(pk__in=[recent.pk, old.pk]).values_list("pk", flat=True)) == [recent.pk]
    with pytest.raises(DatabaseError, match="append-only"), transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("DELETE FROM audit_auditentry WHERE id = %s", [recent.pk])  # the variable is gone


def test_deleting_a_user_keeps_their_entries_and_who_they_were(world, api):
    quota = Quota.objects.get(team=world.team, pool=world.pool)
    helper = UserFactory(username="temp-admin", is_staff=True)
    helper_id = helper.pk
    assert api(helper).patch(f"/api/v1/quotas/{quota.pk}/", {"max_ge": 5}, format="json").status_code == 200
    helper.delete()
    entry = last_entry(Quota, quota.pk)
    assert (entry.actor_id, entry.actor_label) == (helper_id, "temp-admin")


# --- retention -----------------------------------------------------------------------------------

def test_the_retention_task_deletes_only_entries_older_than_the_setting(world, settings):
    settings.AUDIT_RETENTION_DAYS = 400
    old = _an_entry(world, timestamp=timezone.now() - timedelta(days=401))
    kept = _an_entry(world, timestamp=timezone.now() - timedelta(days=399))
    before = AuditEntry.objects.count()
    assert delete_expired_audit_entries.apply().get() == 1
    assert AuditEntry.objects.count() == before - 1
    assert not AuditEntry.objects.filter(pk=old.pk).exists() and AuditEntry.objects.filter(pk=kept.pk).exists()


def test_the_retention_is_at_least_a_day(world):
    with pytest.raises(ValueError):
        audit_entries_delete_expired(retention_days=0)


# --- the API -------------------------------------------------------------------------------------

URL = "/api/v1/audit/"


def test_the_api_filters_by_actor_object_and_time(world, api):
    staff = api(world.staff)
    quota = Quota.objects.get(team=world.team, pool=world.pool)
    staff.patch(f"/api/v1/quotas/{quota.pk}/", {"max_ge": 7}, format="json")
    node = Node.objects.get(name="node-a")
    staff.patch(f"/api/v1/nodes/{node.pk}/", {"schedulable": False}, format="json")
    _an_entry(world, timestamp=timezone.now() - timedelta(days=30))

    def ids(**query):
        response = staff.get(URL, query)
        assert response.status_code == 200, response.content
        return [row["id"] for row in response.json()["results"]]

    quota_entries = ids(object_type="allocations.quota", object_id=quota.pk)
    assert quota_entries == [e.pk for e in reversed(entries_for(Quota, quota.pk))]
    row = staff.get(URL, {"object_type": "allocations.quota", "object_id": quota.pk}).json()["results"][0]
    assert {k: row[k] for k in ("actor", "source", "action", "object_type", "object_id")} == {
        "actor": "staff", "source": "api", "action": "update", "object_type": "allocations.quota",
        "object_id": quota.pk}
    assert set(ids(actor="staff")) >= {quota_entries[0], last_entry(Node, node.pk).pk}
    assert all(AuditEntry.objects.get(pk=pk).actor_id is None for pk in ids(actor="system"))
    old_ones = ids(until=(timezone.now() - timedelta(days=1)).isoformat())
    assert len(old_ones) == 1 and old_ones[0] not in ids(since=(timezone.now() - timedelta(days=1)).isoformat())
    assert ids(object_type="inventory.node", object_id=node.pk) == [e.pk for e in reversed(entries_for(Node, node.pk))]


@pytest.mark.parametrize("who", ["owner", "member", "outsider"])
def test_the_api_is_staff_only(world, api, who):
    assert api(getattr(world, who)).get(URL).status_code == 403
    assert api().get(URL).status_code in (401, 403)


@pytest.mark.parametrize(("query", "field", "rule"), [
    ({"actr": "staff"}, "actr", "unknown_field"),
    ({"object_type": "teams.nothing"}, "object_type", "invalid_choice"),
    ({"object_id": "x"}, "object_id", "invalid"),
    ({"since": "yesterday"}, "since", "invalid"),
])
def test_the_api_refuses_unknown_parameters_and_bad_values(world, api, query, field, rule):
    response = api(world.staff).get(URL, query)
    assert response.status_code == 400, response.content
    assert (field, rule) in [(e["field"], e["rule"]) for e in response.json()["errors"]]


def test_the_api_takes_paging(world, api):
    response = api(world.staff).get(URL, {"limit": 2, "offset": 1})
    assert response.status_code == 200 and len(response.json()["results"]) == 2


# --- the page and the admin ----------------------------------------------------------------------

def test_the_audit_page_lists_filtered_entries_for_staff_only(world, api):
    quota = Quota.objects.get(team=world.team, pool=world.pool)
    api(world.staff).patch(f"/api/v1/quotas/{quota.pk}/", {"max_ge": 7}, format="json")
    made = reserve(api(world.member), hours_from_now=24)
    client = Client()
    client.force_login(world.staff)
    page = client.get("/audit/", {"object_type": "allocations.quota", "object_id": quota.pk})
    assert page.status_code == 200
    text = page.content.decode()
    entries = text[text.index("<tbody>"):]  # the filter lists every object type by name; the entries are filtered
    assert "max_ge" in entries and "ml in a100" in entries and "Reservation" not in entries
    reservations = client.get("/audit/", {"object_type": "allocations.reservation"}).content.decode()
    assert f'href="/reservations/{made["id"]}/"' in reservations
    client.force_login(world.member)
    assert client.get("/audit/").status_code == 403


def test_the_admin_shows_entries_read_only(world):
    entry = _an_entry(world)
    client = Client()
    client.force_login(world.staff)  # a superuser
    assert client.get("/admin/audit/auditentry/").status_code == 200
    assert client.get(f"/admin/audit/auditentry/{entry.pk}/change/").status_code == 200
    assert client.get("/admin/audit/auditentry/add/").status_code == 403
    assert client.get(f"/admin/audit/auditentry/{entry.pk}/delete/").status_code == 403
    assert client.post(f"/admin/audit/auditentry/{entry.pk}/change/", {"object_repr": "forged"}).status_code == 403
    assert AuditEntry.objects.get(pk=entry.pk).object_repr == "ml"


def test_beat_runs_the_retention_task_on_its_period(settings):
    from config.celery import app

    app.loader.import_default_modules()
    app.finalize()
    schedule = {entry["task"]: entry["schedule"] for entry in app.conf.beat_schedule.values()}
    assert "audit.tasks.delete_expired_audit_entries" in schedule
    period = schedule["audit.tasks.delete_expired_audit_entries"]
    seconds = period if isinstance(period, (int, float)) else period.run_every.total_seconds()
    assert seconds == settings.AUDIT_RETENTION_CHECK_SECONDS
