"""The Celery worker and beat, run as the Procfile runs them, through a broker outage and a killed worker.

The broker outage uses a Redis of the test's own (tests/outages.py) that it stops and starts,
so the suite's shared Redis stays up; the worker, beat and this test process all use it as
their broker.

Timings are short so that the tests are quick; `python -m benchmarks.worker_recovery` runs the
same two scenarios with the production defaults (WORKER_RECOVERY_TIMINGS=production) and
reports how long the recovery took.
"""
from __future__ import annotations

import os
import signal
import socket
import sys
import threading
import time
from datetime import datetime, timedelta

import pytest
from django.utils import timezone

from allocations.apply.backends.agent import host_lease_report, host_leases
from allocations.models import Allocation, ApplyJob, Reservation
from allocations.services import ReservationRequest, reservation_create
from common import crypto
from inventory.models import Node
from tests.conftest import start_server, stop_process_group, wait_for
from tests.factories import (
    ClusterFactory,
    MembershipFactory,
    PoolFactory,
    QuotaFactory,
    TeamFactory,
    UserFactory,
    add_node,
)
from tests.outages import private_redis  # noqa: F401

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]

PRODUCTION_TIMINGS = os.environ.get("WORKER_RECOVERY_TIMINGS") == "production"
SWEEP_SECONDS = 5.0 if PRODUCTION_TIMINGS else 1.0  # production: config/settings.py's defaults


@pytest.fixture
def broker(private_redis, worker_env):  # noqa: F811
    """Point the worker's environment and this process's Celery app at the private Redis."""
    from config.celery import app

    def publish_to(url: str) -> None:
        app.conf.broker_url = url
        # Celery caches its connection and producer pools on first use: forget both.
        app.close()
        app.amqp._producer_pool = None

    worker_env["REDIS_URL"] = private_redis.url(0)
    shared_broker = app.conf.broker_url
    publish_to(private_redis.url(0))
    yield private_redis
    publish_to(shared_broker)


def procfile_worker(env: dict, tmp_path, name: str = "worker"):
    """`celery worker` as the Procfile starts it (thread pool, concurrency 4, no embedded beat)."""
    log = tmp_path / f"{name}.log"
    return start_server(
        [sys.executable, "-m", "celery", "-A", "config", "worker", "--loglevel", "INFO", "--pool", "threads",
         "--concurrency", "4"],
        env=env, log_path=log, what="the Celery worker", ready=lambda: b"ready." in log.read_bytes())


def procfile_beat(env: dict, tmp_path):
    log = tmp_path / "beat.log"
    return start_server(
        [sys.executable, "-m", "celery", "-A", "config", "beat", "--loglevel", "INFO", "--schedule",
         str(tmp_path / "beat-schedule")],
        env=env, log_path=log, what="Celery beat", ready=lambda: b"beat: Starting" in log.read_bytes())


def members_team(pool, max_ge: int):
    team = TeamFactory(slug="ml")
    QuotaFactory(team=team, pool=pool, max_ge=max_ge)
    member = UserFactory(username="member")
    MembershipFactory(user=member, team=team)
    return team, member


def book_one(member, pool_slug: str) -> int:
    return reservation_create(actor=member, request=ReservationRequest(
        team="ml", pool=pool_slug, gpus=1, ends_at=timezone.now() + timedelta(hours=1))).pk


def book_one_while_the_broker_is_down(pool, team, member) -> int:
    """What a request committed during the outage leaves: a scheduled row whose activation message never left."""
    now = timezone.now()
    gpu = pool.gpus.exclude(allocations__ends_at__gt=now).order_by("pk").first()
    reservation = Reservation.objects.create(team=team, pool=pool, requested_by=member, gpus=1, starts_at=now,
                                             ends_at=now + timedelta(hours=1))
    Allocation.objects.create(reservation=reservation, gpu=gpu, starts_at=now, ends_at=reservation.ends_at)
    return reservation.pk


def at_a_steady_rate(book, seconds: float, per_second: float = 3.0, tick=lambda: None) -> list[int]:
    ids, start = [], time.monotonic()
    while time.monotonic() - start < seconds:
        ids.append(book())
        tick()
        time.sleep(max(0.0, start + len(ids) / per_second - time.monotonic()))
    return ids


def last_connected_at(worker_log: str) -> datetime:
    """When the worker last logged 'Connected to redis://…' (its log's local time)."""
    line = [line for line in worker_log.splitlines() if "Connected to redis" in line][-1]
    return datetime.strptime(line[1:24], "%Y-%m-%d %H:%M:%S,%f")


class SlowAgent:
    """Stands in for a host's agent that answers only from a point on: until then every apply
    waits for it with countdown retries, which the worker holds unacknowledged (the load of the
    report). Its answer is the one `python -m agent` sends: the leases it now holds."""

    def __init__(self, node: Node) -> None:
        self.node = node
        self.answering = False

    def tick(self) -> None:
        if self.answering:
            Node.objects.filter(pk=self.node.pk).update(last_seen_at=timezone.now())
            host_lease_report(node=self.node, held=[lease["key"] for lease in host_leases(self.node)])


def test_the_worker_rides_out_a_redis_outage_under_load_and_every_reservation_is_applied(
        broker, worker_env, tmp_path):
    worker_env.update(RESERVATION_SWEEP_SECONDS=str(SWEEP_SECONDS), HOST_SILENCE_TIMEOUT_SECONDS="3600")
    if not PRODUCTION_TIMINGS:
        worker_env.update(APPLY_LOST_MESSAGE_SECONDS="2", APPLY_RETRY_CAP_SECONDS="4")
    pool = PoolFactory(slug="big", name="Big")
    node = add_node(pool, "node-big", 200)
    Node.objects.filter(pk=node.pk).update(last_seen_at=timezone.now(), healthy=True)
    team, member = members_team(pool, 200)
    agent = SlowAgent(node)
    worker = procfile_worker(worker_env, tmp_path)
    beat = procfile_beat(worker_env, tmp_path)
    try:
        before = at_a_steady_rate(lambda: book_one(member, "big"), seconds=5)
        broker.stop()
        during = at_a_steady_rate(lambda: book_one_while_the_broker_is_down(pool, team, member), seconds=6)
        back_at, back_at_wall = time.monotonic(), datetime.now()  # the worker may reconnect before start() returns
        broker.start()
        agent.answering = True
        after = at_a_steady_rate(lambda: book_one(member, "big"), seconds=4, tick=agent.tick)
        created = before + during + after

        def all_active() -> bool:
            assert worker.poll() is None, "the worker exited:\n" + worker.log_path.read_text()[-4000:]
            assert beat.poll() is None, "beat exited:\n" + beat.log_path.read_text()[-4000:]
            agent.tick()
            return Reservation.objects.filter(pk__in=created, state="active").count() == len(created)

        wait_for(all_active, timeout=150 if PRODUCTION_TIMINGS else 45, interval=0.5,
                 message="every reservation to become active after the outage")
        all_active_after = time.monotonic() - back_at
        reconnected_at = last_connected_at(worker.log_path.read_text())
        print(f"RECOVERY worker reconnected {(reconnected_at - back_at_wall).total_seconds():.1f}s and all "
              f"{len(created)} reservations active {all_active_after:.1f}s after Redis came back")
    finally:
        stop_process_group(worker)
        stop_process_group(beat)


class SilentApiServer:
    """A Kubernetes API server URL that accepts connections and never answers; it counts the
    connections open at once (each apply attempt holds one while it waits)."""

    def __init__(self) -> None:
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.listener.getsockname()[1]}"
        self.lock = threading.Lock()
        self.open: list[socket.socket] = []
        self.accepted = 0
        self.most_open_at_once = 0
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            with self.lock:
                self.open.append(conn)
                self.accepted += 1
                self.most_open_at_once = max(self.most_open_at_once, len(self.open))
            threading.Thread(target=self._hold, args=(conn,), daemon=True).start()

    def _hold(self, conn: socket.socket) -> None:
        try:
            while conn.recv(65536):  # read the request, answer nothing, until the client goes away
                pass
        except OSError:
            pass
        with self.lock:
            if conn in self.open:
                self.open.remove(conn)
        conn.close()

    def close(self) -> None:
        self.listener.close()
        with self.lock:
            for conn in self.open:
                conn.shutdown(socket.SHUT_RDWR)

    def kubeconfig(self) -> str:
        return (f"apiVersion: v1\nkind: Config\ncurrent-context: silent\n"
                f"clusters: [{{name: silent, cluster: {{server: '{self.url}'}}}}]\n"
                f"users: [{{name: portal, user: {{token: not-checked}}}}]\n"
                f"contexts: [{{name: silent, context: {{cluster: silent, user: portal}}}}]\n")


def test_a_job_whose_worker_was_killed_mid_apply_is_taken_back_within_its_lease_and_never_runs_twice_at_once(
        worker_env, tmp_path):
    import redis

    lease = 15.0 if PRODUCTION_TIMINGS else 3.0
    worker_env.update(APPLY_JOB_LEASE_SECONDS=str(lease), RESERVATION_SWEEP_SECONDS=str(SWEEP_SECONDS),
                      KUBE_REQUEST_TIMEOUT_SECONDS="300", RECONCILE_SECONDS="3600", CLUSTER_DISCOVERY_SECONDS="3600")
    redis.Redis.from_url(worker_env["REDIS_URL"]).flushdb()
    server = SilentApiServer()
    cluster = ClusterFactory(slug="k8s", kind="kubernetes", kubeconfig_encrypted=crypto.encrypt(server.kubeconfig()))
    pool = PoolFactory(slug="kube", name="Kube")
    add_node(pool, "kube-node", 2, cluster=cluster)
    _, member = members_team(pool, 2)
    beat = procfile_beat(worker_env, tmp_path)
    first = procfile_worker(worker_env, tmp_path, name="first-worker")
    second = None
    try:
        rid = book_one(member, "kube")
        job = wait_for(lambda: ApplyJob.objects.filter(reservation_id=rid, action="apply", status="running").first(),
                       message="the apply job to start")
        wait_for(lambda: server.accepted == 1, message="the apply to reach the API server")
        # A live worker keeps its claim however long the cluster takes: twice the lease, still attempt 1.
        kept_until = time.monotonic() + 2 * lease
        while time.monotonic() < kept_until:
            job.refresh_from_db()
            assert (job.status, job.attempts) == ("running", 1)
            time.sleep(0.2)

        os.killpg(first.pid, signal.SIGKILL)
        first.wait()
        killed_at = time.monotonic()
        second = procfile_worker(worker_env, tmp_path, name="second-worker")

        def taken_back() -> bool:
            job.refresh_from_db()
            return job.attempts >= 2
        wait_for(taken_back, timeout=lease + SWEEP_SECONDS + 20, message="the orphaned job to be taken back")
        took = time.monotonic() - killed_at
        print(f"RECOVERY orphaned running job taken back and started again {took:.1f}s after its worker was "
              f"killed (lease {lease:g}s, sweep every {SWEEP_SECONDS:g}s)")
        assert "stopped renewing its claim" in job.error
        wait_for(lambda: server.accepted == 2, message="the second attempt to reach the API server")
        assert server.most_open_at_once == 1, "two attempts of the job ran at once"
        assert Reservation.objects.get(pk=rid).state == "applying"  # retried, neither lost nor failed
    finally:
        server.close()
        for process in (first, second, beat):
            if process is not None:
                stop_process_group(process)
