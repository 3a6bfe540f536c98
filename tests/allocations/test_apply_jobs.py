"""Apply jobs: retries with backoff, the deadline, refusals, lost workers, and the agent lease exchange."""
from __future__ import annotations

import logging
from datetime import timedelta

import pytest
from django.core import mail
from django.db.models import F
from django.utils import timezone

from allocations import failover, services
from allocations.apply import jobs
from allocations.apply.backends import BackendError, BackendRejected, SyncReport
from allocations.apply.backends.agent import AgentBackend, host_lease_report, lease_key
from allocations.apply.selectors import cluster_desired
from allocations.models import Allocation, ApplyJob, HostLeaseReport, Reservation
from allocations.tasks import sweep_reservations
from inventory import services as inventory_services
from inventory.models import Node
from tests.allocations.test_reservation_lifecycle import reserve, run_open_jobs

State = Reservation.State


class ScriptedBackend:
    """Stands in for a cluster: answers each sync with the next scripted outcome."""

    name = "scripted"
    reads_pools = True

    def __init__(self, outcomes):
        self.outcomes = list(outcomes)
        self.calls = []

    def sync(self, desired, *, teams=None):
        self.calls.append((desired, teams))
        outcome = self.outcomes.pop(0) if self.outcomes else SyncReport(target="scripted")
        if isinstance(outcome, Exception):
            raise outcome
        return outcome


@pytest.fixture
def scripted(monkeypatch):
    def install(*outcomes):
        backend = ScriptedBackend(outcomes)
        monkeypatch.setattr(jobs, "backend_for", lambda cluster: backend)
        return backend

    return install


def activated(client):
    r = reserve(client, gpus=2)
    services.reservation_activate(reservation_id=r["id"])
    return Reservation.objects.get(pk=r["id"]), ApplyJob.objects.get(reservation_id=r["id"], action="apply")


def test_a_remote_error_is_retried_with_exponential_backoff_then_succeeds(world, api, scripted, settings):
    settings.APPLY_RETRY_BASE_SECONDS, settings.APPLY_RETRY_CAP_SECONDS = 2.0, 5.0
    backend = scripted(BackendError("connection refused"), BackendError("timed out"), BackendError("503"),
                       SyncReport(target="t", changes=["created namespace gpupool-ml"]))
    reservation, job = activated(api(world.member))
    now = timezone.now()
    delays = []
    for attempt in (1, 2, 3):
        assert jobs.job_run(job_id=job.pk, now=now) == "retrying"
        job.refresh_from_db()
        assert job.attempts == attempt and job.error
        delays.append((job.next_attempt_at - timezone.now()).total_seconds())
        assert jobs.job_run(job_id=job.pk, now=now) == ""  # not due yet: nobody claims it
        now = job.next_attempt_at
    assert [round(d) for d in delays] == [2, 4, 5]  # 2, 4, then capped at 5
    assert jobs.job_run(job_id=job.pk, now=now) == "succeeded"
    job.refresh_from_db()
    assert job.status == "succeeded" and job.attempts == 4 and job.changes == ["created namespace gpupool-ml"]
    assert Reservation.objects.get(pk=reservation.pk).state == State.ACTIVE
    assert backend.calls[0][1] == ["ml"]  # the sync is for the reservation's team


def test_a_reservation_never_stays_applying_past_its_deadline(world, api, scripted, settings):
    settings.APPLY_DEADLINE = timedelta(seconds=30)
    scripted(*[BackendError("apiserver unreachable")] * 20)
    reservation, job = activated(api(world.member))
    now = timezone.now()
    while (status := jobs.job_run(job_id=job.pk, now=now)) == "retrying":
        job.refresh_from_db()
        now = job.next_attempt_at
    assert status == "failed"
    reservation.refresh_from_db()
    assert reservation.state == State.FAILED
    assert "Not confirmed within 0.5 minutes; last error: apiserver unreachable" in reservation.reason
    # Its GPUs are free again at once.
    assert not Allocation.objects.filter(reservation=reservation, ends_at__gt=timezone.now()).exists()
    assert ApplyJob.objects.filter(action="reconcile", status="queued").exists()  # cleans up what was half-done


def test_a_refusal_fails_at_once_with_the_clusters_reason(world, api, scripted):
    scripted(BackendRejected("ResourceQuota is forbidden by admission webhook"))
    reservation, job = activated(api(world.member))
    assert jobs.job_run(job_id=job.pk) == "failed"
    reservation.refresh_from_db()
    assert reservation.state == State.FAILED and "forbidden by admission webhook" in reservation.reason
    detail = api(world.member).get(f"/api/v1/reservations/{reservation.pk}/").json()
    assert detail["apply_jobs"][0]["status"] == "failed"
    assert "forbidden" in detail["apply_jobs"][0]["error"]


def test_a_job_whose_worker_died_is_taken_back_by_the_sweep(world, api, scripted):
    scripted()
    reservation, job = activated(api(world.member))
    ApplyJob.objects.filter(pk=job.pk).update(status="running", attempts=1,
                                              deadline=timezone.now() - timedelta(minutes=5))
    assert sweep_reservations()["apply_jobs"] == 1
    job.refresh_from_db()
    assert job.status == "succeeded" and job.attempts == 2
    assert Reservation.objects.get(pk=reservation.pk).state == State.ACTIVE


def test_a_running_job_whose_lease_lapsed_is_taken_back_long_before_its_deadline(world, api, scripted):
    scripted()
    reservation, job = activated(api(world.member))
    ApplyJob.objects.filter(pk=job.pk).update(status="running", attempts=1,
                                              lease_until=timezone.now() - timedelta(seconds=1))
    assert job.deadline > timezone.now() + timedelta(minutes=5)
    assert sweep_reservations()["apply_jobs"] == 1
    job.refresh_from_db()
    assert job.status == "succeeded" and job.attempts == 2 and job.lease_until is None
    assert Reservation.objects.get(pk=reservation.pk).state == State.ACTIVE


def test_a_running_job_whose_lease_holds_is_left_alone(world, api, scripted):
    scripted()
    _, job = activated(api(world.member))
    ApplyJob.objects.filter(pk=job.pk).update(status="running", attempts=1,
                                              lease_until=timezone.now() + timedelta(seconds=10))
    assert sweep_reservations()["apply_jobs"] == 0
    assert ApplyJob.objects.get(pk=job.pk).status == "running"


def test_an_attempt_taken_back_while_it_ran_cannot_write_its_late_outcome(world, api, monkeypatch):
    """The first attempt stalls past its lease; the sweep takes the job back and the second attempt
    applies it; then the first attempt ends with a refusal, which must change nothing."""

    class StallsOnceThenApplies:
        name, reads_pools, calls = "scripted", True, 0

        def sync(self, desired, *, teams=None):
            self.calls += 1
            if self.calls == 1:
                ApplyJob.objects.filter(pk=job.pk).update(lease_until=timezone.now() - timedelta(seconds=1))
                assert jobs.jobs_due_ids() == [job.pk]
                assert jobs.job_run(job_id=job.pk) == "succeeded"
                raise BackendRejected("a late answer of the first attempt")
            return SyncReport(target="scripted")

    backend = StallsOnceThenApplies()
    monkeypatch.setattr(jobs, "backend_for", lambda cluster: backend)
    reservation, job = activated(api(world.member))
    assert jobs.job_run(job_id=job.pk) == ""
    job.refresh_from_db()
    assert (job.status, job.attempts, job.error) == ("succeeded", 2, "")
    assert Reservation.objects.get(pk=reservation.pk).state == State.ACTIVE


def test_the_page_shows_the_jobs(world, client, scripted):
    scripted(BackendError("connection refused"))
    client.force_login(world.member)
    from rest_framework.test import APIClient

    api_client = APIClient()
    api_client.force_authenticate(world.member)
    reservation, job = activated(api_client)
    jobs.job_run(job_id=job.pk)
    page = client.get(f"/reservations/{reservation.pk}/").content.decode()
    assert "Waiting to retry" in page and "connection refused" in page and "agent" in page


# --- the agent backend: leases a host confirms ------------------------------------------------

def with_agent(node_name: str) -> Node:
    node = Node.objects.get(name=node_name)
    node.last_seen_at = timezone.now()
    node.save(update_fields=["last_seen_at"])
    return node


def test_an_agent_host_must_confirm_its_leases_before_the_reservation_is_active(world, api):
    node_a = with_agent("node-a")
    reservation, job = activated(api(world.member))
    assert set(reservation.allocations.values_list("gpu__node__name", flat=True)) == {"node-a"}
    assert jobs.job_run(job_id=job.pk) == "retrying"
    job.refresh_from_db()
    assert "waiting for host agents to confirm: host node-a does not hold lease(s)" in job.error

    keys = [lease_key(reservation.pk, uuid) for uuid in reservation.allocations.values_list("gpu__uuid", flat=True)]
    host_lease_report(node=node_a, held=keys)
    assert jobs.job_run(job_id=job.pk, now=job.next_attempt_at) == "succeeded"
    assert Reservation.objects.get(pk=reservation.pk).state == State.ACTIVE

    # Release: the undo waits until the host drops the leases.
    api(world.member).post(f"/api/v1/reservations/{reservation.pk}/release/")
    undo = ApplyJob.objects.get(reservation=reservation, action="undo")
    assert jobs.job_run(job_id=undo.pk) == "retrying"
    host_lease_report(node=node_a, held=[])
    undo.refresh_from_db()
    assert jobs.job_run(job_id=undo.pk, now=undo.next_attempt_at) == "succeeded"
    assert Reservation.objects.get(pk=reservation.pk).state == State.RELEASED


def test_a_teams_apply_looks_only_at_the_hosts_it_concerns_and_the_reconcile_at_all(world, api):
    node_a, node_b = with_agent("node-a"), with_agent("node-b")
    client = api(world.member)
    old, _ = activated(client)
    Reservation.objects.filter(pk=old.pk).update(state=State.RELEASED)
    stale = lease_key(old.pk, "GPU-stale")  # node-b never dropped a lease of the team's earlier reservation
    host_lease_report(node=node_b, held=[stale])

    reservation, job = activated(client)
    assert set(reservation.allocations.values_list("gpu__node__name", flat=True)) == {"node-a"}
    keys = [lease_key(reservation.pk, uuid) for uuid in reservation.allocations.values_list("gpu__uuid", flat=True)]
    host_lease_report(node=node_a, held=keys)
    # node-b's stale lease of the team's released reservation does not hold up this apply ...
    assert jobs.job_run(job_id=job.pk) == "succeeded"
    # ... the reconcile finds it and sends node-b its right set.
    report = AgentBackend(node_a.cluster).sync(cluster_desired(node_a.cluster), teams=None)
    assert report.changes == [f"host node-b still holds lease(s) {stale}; the right set was sent to its agent again"]


def test_the_lease_api_gives_a_host_its_leases_and_records_what_it_holds(world, api):
    staff = world.staff
    token, key = inventory_services.host_token_create(actor=staff, cluster=Node.objects.get(name="node-a").cluster,
                                                      host_name="node-a")
    with_agent("node-a")
    reservation, job = activated(api(world.member))
    Reservation.objects.filter(pk=reservation.pk).update(state=State.ACTIVE)
    agent = api()
    agent.credentials(HTTP_AUTHORIZATION=f"Host {key}")
    answer = agent.post("/api/v1/agent/leases/", {"held": []}, format="json")
    assert answer.status_code == 200, answer.content
    leases = answer.json()["leases"]
    assert {lease["gpu_uuid"] for lease in leases} == set(reservation.allocations.values_list("gpu__uuid", flat=True))
    assert all(lease["team"] == "ml" for lease in leases)
    agent.post("/api/v1/agent/leases/", {"held": [lease["key"] for lease in leases]}, format="json")
    assert sorted(Node.objects.get(name="node-a").lease_report.held) == sorted(lease["key"] for lease in leases)
    bad = agent.post("/api/v1/agent/leases/", {"held": ["not a key"]}, format="json")
    assert bad.status_code == 400 and bad.json()["errors"][0]["field"].startswith("held")


def test_a_lease_report_with_more_failures_than_a_host_can_have_is_a_400(world, api):
    # `failed` had no bound (`held` and `unleased_in_use` have 1,024): 5,000 keys of 500 characters were stored.
    _, key = inventory_services.host_token_create(actor=world.staff, cluster=Node.objects.get(name="node-a").cluster,
                                                  host_name="node-a")
    with_agent("node-a")
    agent = api()
    agent.credentials(HTTP_AUTHORIZATION=f"Host {key}")
    failed = {lease_key(i, f"GPU-aaaaaaaa-{i:08d}"): "x" * 500 for i in range(1, 1026)}
    answer = agent.post("/api/v1/agent/leases/", {"held": [], "failed": failed}, format="json")
    assert answer.status_code == 400, answer.content
    assert answer.json()["errors"][0]["field"] == "failed" and answer.json()["errors"][0]["rule"] == "max_length"
    assert not HostLeaseReport.objects.exists()
    failed.popitem()  # 1,024 is fine
    assert agent.post("/api/v1/agent/leases/", {"held": [], "failed": failed}, format="json").status_code == 200

def test_reconcile_reports_drift_on_an_agent_host(world, api):
    node_a = with_agent("node-a")
    reservation, job = activated(api(world.member))
    Reservation.objects.filter(pk=reservation.pk).update(state=State.ACTIVE)
    host_lease_report(node=node_a, held=["999:GPU-00000000-dead-beef"])  # a stale lease, the real ones missing
    report = AgentBackend(node_a.cluster).sync(cluster_desired(node_a.cluster), teams=None)
    assert len(report.changes) == 1
    assert "does not hold lease(s)" in report.changes[0] and "still holds lease(s) 999:GPU-00000000-dead-beef" in \
        report.changes[0]
    result = jobs.cluster_reconcile(cluster_id=node_a.cluster_id)
    assert result["repaired"] == report.changes
    assert ApplyJob.objects.filter(action="reconcile", status="succeeded").count() == 1


def test_a_quiet_reconcile_leaves_no_row(world):
    cluster = Node.objects.get(name="node-a").cluster
    assert jobs.cluster_reconcile(cluster_id=cluster.pk) == {"cluster": cluster.slug, "repaired": []}
    assert not ApplyJob.objects.exists()


class _Told(logging.Handler):
    """What a logger said (CI runs pytest without its logging plugin, so no caplog)."""

    def __init__(self) -> None:
        super().__init__(level=logging.INFO)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


def test_processes_without_a_lease_are_told_once_not_repaired_every_reconcile(world):
    """A GPU busy outside the portal is a standing condition (the host's page shows it): the reconcile,
    every 30 s, neither claims to repair it nor keeps a row for it; the lease report logs it when it
    appears or changes."""
    node_a = with_agent("node-a")
    logger, handler = logging.getLogger("allocations.apply.backends.agent"), _Told()
    logger.addHandler(handler)
    level, logger.level = logger.level, logging.INFO
    try:
        for _ in range(3):
            host_lease_report(node=node_a, held=[], unleased_in_use=["GPU-cccccccc-0003"])
            assert jobs.cluster_reconcile(cluster_id=node_a.cluster_id) == {"cluster": node_a.cluster.slug,
                                                                             "repaired": []}
        host_lease_report(node=node_a, held=[], unleased_in_use=[])
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
    assert not ApplyJob.objects.exists()
    told = [(r.levelname, r.getMessage()) for r in handler.records]
    assert told == [
        ("WARNING", "host node-a: GPU(s) GPU-cccccccc-0003 run processes without a lease (not booked through "
                    "the portal)"),
        ("INFO", "host node-a: no GPU runs processes without a lease any more"),
    ]


# --- failover -----------------------------------------------------------------------------------

def test_a_dead_nodes_reservations_move_to_healthy_gpus_and_the_owners_are_told(world, api, settings):
    world.member.email, world.owner.email = "member@example.com", "owner@example.com"
    world.member.save(), world.owner.save()
    client = api(world.member)
    running, _ = activated(client)
    run_open_jobs()
    later = reserve(client, gpus=1, hours_from_now=3)
    dead = Node.objects.get(name=running.allocations.first().gpu.node.name)
    assert Allocation.objects.get(reservation_id=later["id"]).gpu.node == dead  # packed on the same node
    Node.objects.filter(pk=dead.pk).update(healthy=False)

    result = failover.node_failover(node_id=dead.pk, reason="host stopped reporting for 60 s")
    assert result["moved"] == [running.pk, later["id"]] and result["failed"] == []
    running.refresh_from_db()
    assert running.state == State.APPLYING and "Moved from" in running.reason
    now_gpus = running.allocations.filter(ends_at__gt=timezone.now())
    assert now_gpus.count() == 2 and not now_gpus.filter(gpu__node=dead).exists()
    assert running.allocations.filter(gpu__node=dead).exists()  # the used part stays as history
    assert Reservation.objects.get(pk=later["id"]).state == State.SCHEDULED
    # The future one's old booking is an empty window now (it blocks nobody), the new one is elsewhere.
    later_windows = Allocation.objects.filter(reservation_id=later["id"]).filter(ends_at__gt=F("starts_at"))
    assert later_windows.count() == 1 and later_windows.get().gpu.node != dead
    assert run_open_jobs().count("succeeded") >= 1
    assert Reservation.objects.get(pk=running.pk).state == State.ACTIVE
    # Running it again changes nothing.
    assert failover.node_failover(node_id=dead.pk)["moved"] == []


def test_failover_fails_the_reservation_when_nothing_is_free(world, api, django_capture_on_commit_callbacks):
    world.member.email = "member@example.com"
    world.member.save()
    client = api(world.member)
    running, _ = activated(client)
    run_open_jobs()
    reserve(api(world.outsider), team="infra", gpus=4)  # the other node is full
    dead = running.allocations.first().gpu.node
    Node.objects.filter(pk=dead.pk).update(healthy=False)
    with django_capture_on_commit_callbacks(execute=True):
        result = failover.node_failover(node_id=dead.pk, reason="Kubernetes node NotReady")
    assert result["failed"] == [running.pk]
    running.refresh_from_db()
    assert running.state == State.FAILED and "no healthy GPUs of pool a100 are free" in running.reason
    assert len(mail.outbox) == 1
    assert sorted(mail.outbox[0].to) == sorted({"member@example.com", world.owner.email} - {""})
    assert "failed" in mail.outbox[0].subject and f"/reservations/{running.pk}/" in mail.outbox[0].body
    html, mime = mail.outbox[0].alternatives[0]
    assert mime == "text/html" and "no healthy GPUs of pool a100 are free" in html and "Failed" in html


def test_a_silent_host_announces_itself_and_the_sweep_moves_its_work(world, api, django_capture_on_commit_callbacks,
                                                                    monkeypatch):
    started = []
    from allocations import tasks

    monkeypatch.setattr(tasks.failover_node, "delay", lambda node_id, reason="": started.append((node_id, reason)))
    client = api(world.member)
    running, _ = activated(client)
    run_open_jobs()
    node = running.allocations.first().gpu.node
    Node.objects.filter(pk=node.pk).update(last_seen_at=timezone.now() - timedelta(minutes=5))
    with django_capture_on_commit_callbacks(execute=True):
        assert inventory_services.nodes_mark_silent(timeout=timedelta(seconds=60)) == [node.pk]
    assert started == [(node.pk, "host stopped reporting for 60 s")]
    # Even with that task lost, the sweep finds the unhealthy node still holding work.
    assert sweep_reservations()["failover"] == 1
    assert not Reservation.objects.get(pk=running.pk).allocations.filter(
        gpu__node=node, ends_at__gt=timezone.now()).exists()


def test_staff_list_every_job_and_filter_reconciles_members_may_not(world, api, scripted):
    scripted(BackendRejected("namespaces is forbidden: User cannot create resource"))
    reservation, job = activated(api(world.member))
    jobs.job_run(job_id=job.pk)
    listed = api(world.staff).get("/api/v1/apply-jobs/?status=failed&action=apply").json()
    assert listed["count"] == 1 and "forbidden" in listed["results"][0]["error"]
    assert api(world.staff).get("/api/v1/apply-jobs/?action=reconcile&status=queued").json()["count"] == 1
    assert api(world.member).get("/api/v1/apply-jobs/").status_code == 403


def test_a_failing_reconcile_keeps_one_row_per_outage_and_clusters_without_credentials_are_skipped(world, scripted):
    from tests.factories import ClusterFactory

    cluster = Node.objects.get(name="node-a").cluster
    scripted(BackendError("no route to host"), BackendError("no route to host"), BackendError("TLS handshake"))
    for _ in range(3):
        jobs.cluster_reconcile(cluster_id=cluster.pk)
    rows = list(ApplyJob.objects.filter(action="reconcile").order_by("pk").values_list("error", "attempts"))
    assert rows == [("no route to host", 2), ("TLS handshake", 1)]
    bare = ClusterFactory(slug="k8s-nocreds", kind="kubernetes")
    assert jobs.cluster_reconcile(cluster_id=bare.pk) == {"cluster": "k8s-nocreds",
                                                           "skipped": "no credentials registered"}


def test_an_answer_that_arrives_while_the_attempt_runs_is_not_missed(world, api, scripted):
    """The host answers between the push and the job going back to waiting: it is looked at again at once."""
    from allocations.apply.backends import BackendPending

    node_a = with_agent("node-a")

    class AnswersDuringSync(ScriptedBackend):
        def sync(self, desired, *, teams=None):
            host_lease_report(node=node_a, held=[])  # the agent's answer, racing the attempt
            return super().sync(desired, teams=teams)

    scripted()  # installs the monkeypatch that restores backend_for afterwards
    backend = AnswersDuringSync([BackendPending("waiting for host node-a")])
    jobs.backend_for = lambda cluster: backend
    reservation, job = activated(api(world.member))
    assert jobs.job_run(job_id=job.pk) == "retrying"
    job.refresh_from_db()
    assert job.next_attempt_at <= timezone.now()  # due now, not after the 2 s backoff
