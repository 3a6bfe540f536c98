"""Two of every process (web, ws, worker, beat) on one PostgreSQL and one Redis, and one of each killed
with SIGKILL while bookings, telemetry and sockets go through both: the survivors carry on.

The test plays the load balancer: a request refused by a dead web replica is sent to the other, and a
socket closed by a dead ws replica reconnects to the other (what an Ingress does in production).
"""
from __future__ import annotations

import asyncio
import itertools
import json
import os
import re
import signal
import sys
import threading
import time
from datetime import datetime, timedelta

import httpx
import pytest
import websockets
from django.utils import timezone

from allocations.models import Reservation
from inventory import services
from inventory.models import Node
from teams.services import api_token_create
from tests.conftest import free_port, healthz_answers, start_server, stop_process_group, wait_for
from tests.monitoring.conftest import batch, payload, sample

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]
BEAT_LOCK, BEAT_TICK, SWEEP_PERIOD, ALERT_PERIOD = 3, 0.5, 1, 2
SENT = re.compile(rb"\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}): INFO/MainProcess\] Scheduler: Sending due task "
                  rb"(sweep reservations|evaluate alert rules)")


def _sends(logs, task: str) -> list[datetime]:
    return sorted(datetime.strptime(m.group(1).decode(), "%Y-%m-%d %H:%M:%S,%f")
                  for log in logs for m in SENT.finditer(log.read_bytes()) if m.group(2).decode() == task)


class Fleet:
    """Two of each process; `web`, `ws`: their base URLs; `procs[kind][n]`: the processes."""

    def __init__(self, env: dict, tmp_path):
        self.procs: dict[str, list] = {"web": [], "ws": [], "worker": [], "beat": []}
        self.web, self.ws, self.beat_logs = [], [], []
        for n in range(2):
            port = free_port()
            url = f"http://127.0.0.1:{port}"
            self.procs["web"].append(start_server(
                [sys.executable, "-m", "config.web", "--port", str(port), "--workers", "1", "--threads", "4"],
                env=env, log_path=tmp_path / f"web-{n}.log", what=f"web {n}", ready=healthz_answers(url)))
            self.web.append(url)
            port = free_port()
            url = f"http://127.0.0.1:{port}"
            self.procs["ws"].append(start_server(
                [sys.executable, "-m", "uvicorn", "config.asgi:application", "--host", "127.0.0.1", "--port",
                 str(port), "--lifespan", "off", "--log-level", "warning"],
                env=env, log_path=tmp_path / f"ws-{n}.log", what=f"ws {n}", ready=healthz_answers(url)))
            self.ws.append(url.replace("http", "ws"))
            log = tmp_path / f"worker-{n}.log"
            self.procs["worker"].append(start_server(
                [sys.executable, "-m", "celery", "-A", "config", "worker", "--pool=threads", "--concurrency=2",
                 "--loglevel=INFO", "--without-mingle", "--without-gossip", "-n", f"worker{n}@%h"],
                env=env, log_path=log, what=f"worker {n}", ready=lambda log=log: b"ready." in log.read_bytes()))
            log = tmp_path / f"beat-{n}.log"
            self.procs["beat"].append(start_server(
                [sys.executable, "-m", "celery", "-A", "config", "beat", "--loglevel=INFO"],
                env=env, log_path=log, what=f"beat {n}", ready=lambda log=log: log.exists()))
            self.beat_logs.append(log)

    def kill(self, kind: str, n: int) -> None:
        os.killpg(self.procs[kind][n].pid, signal.SIGKILL)

    def stop(self) -> None:
        for process in itertools.chain.from_iterable(self.procs.values()):
            stop_process_group(process)


def test_one_of_each_process_killed_mid_load_loses_nothing_but_its_own_requests(worker_env, tmp_path, world):
    import redis

    redis.Redis.from_url(worker_env["REDIS_URL"]).flushdb()
    env = {**worker_env, "BEAT_LOCK_SECONDS": str(BEAT_LOCK), "BEAT_TICK_SECONDS": str(BEAT_TICK),
           "RESERVATION_SWEEP_SECONDS": str(SWEEP_PERIOD), "ALERT_EVALUATE_SECONDS": str(ALERT_PERIOD),
           "APPLY_JOB_LEASE_SECONDS": "3"}
    node = Node.objects.get(name="node-a")
    _, host_key = services.host_token_create(actor=world.staff, cluster=node.cluster, host_name=node.name)
    _, token = api_token_create(user=world.member)
    uuids = list(node.gpus.order_by("index").values_list("uuid", flat=True))
    auth = {"Authorization": f"Token {token}"}
    fleet = Fleet(env, tmp_path)
    dead_web: set[str] = set()
    refused: list[str] = []  # requests that met the killed web replica (connection refused or cut)
    failures: list[str] = []  # anything else that went wrong: must stay empty
    booked: list[int] = []
    killed = threading.Event()
    util_posted_after_kill: list[int] = []

    def call(method: str, path: str, n: int, **kwargs) -> httpx.Response | None:
        """Like a load balancer: the n-th replica, or the other when it is dead."""
        for url in (fleet.web[n % 2], fleet.web[(n + 1) % 2]):
            if url in dead_web:
                continue
            try:
                return httpx.request(method, url + path, timeout=15, **kwargs)
            except httpx.TransportError as error:
                refused.append(f"{method} {path} on {url}: {error!r}")
                dead_web.add(url) if killed.is_set() else None
        failures.append(f"{method} {path}: no web replica answered")
        return None

    def bookings(stop: threading.Event) -> None:
        for n in itertools.count():
            if stop.is_set():
                return
            created = call("POST", "/api/v1/reservations/", n, headers=auth, json={
                "pool": "a100", "team": "ml", "gpus": 1,
                "ends_at": (timezone.now() + timedelta(hours=1)).isoformat()})
            if created is None or created.status_code != 201:
                if created is not None:
                    failures.append(f"create answered {created.status_code}: {created.text[:200]}")
                continue
            rid = created.json()["id"]
            booked.append(rid)
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline:
                shown = call("GET", f"/api/v1/reservations/{rid}/", n + 1, headers=auth)
                if shown is not None and shown.json().get("state") == "active":
                    break
                time.sleep(0.2)
            released = call("POST", f"/api/v1/reservations/{rid}/release/", n + 1, headers=auth)
            if released is None or released.status_code != 200:
                failures.append(f"release of {rid}: {getattr(released, 'status_code', None)}")

    def telemetry(stop: threading.Event) -> None:
        for n in itertools.count(1):
            if stop.is_set():
                return
            util = n % 100
            answer = call("POST", "/api/v1/agent/telemetry/", n, headers={"Authorization": f"Host {host_key}"},
                          json=payload(batch([sample(u, util=util) for u in uuids])))
            if answer is not None and answer.status_code != 200:
                failures.append(f"telemetry answered {answer.status_code}")
            if killed.is_set() and answer is not None:
                util_posted_after_kill.append(util)
            time.sleep(0.3)

    async def watch(first: int, received: list, stop: asyncio.Event) -> None:
        """A browser's socket on ws replica `first`; when it closes, reconnect to the other one."""
        order = [fleet.ws[first], fleet.ws[1 - first]]
        for url in itertools.cycle(order):
            if stop.is_set():
                return
            try:
                async with websockets.connect(f"{url}/ws/nodes/{node.pk}/", additional_headers=auth) as socket:
                    while not stop.is_set():
                        try:
                            message = json.loads(await asyncio.wait_for(socket.recv(), 0.5))
                        except TimeoutError:
                            continue
                        if message.get("type") == "telemetry.samples":
                            received.append((url, message["samples"][0]["util"]))
            except (OSError, websockets.exceptions.WebSocketException):
                await asyncio.sleep(0.2)

    async def scenario():
        stop_sockets = asyncio.Event()
        received = [[], []]
        watchers = [asyncio.create_task(watch(n, received[n], stop_sockets)) for n in range(2)]
        stop_load = threading.Event()
        load = [threading.Thread(target=bookings, args=(stop_load,)), threading.Thread(target=telemetry, args=(stop_load,))]
        for thread in load:
            thread.start()
        await asyncio.to_thread(wait_for, lambda: len(booked) >= 3 and all(received), 60, 0.2,
                                "bookings and live samples on both sockets before the kill")
        active_beat = next(n for n in range(2) if SENT.search(fleet.beat_logs[n].read_bytes()))
        killed.set()
        for kind, n in (("web", 0), ("ws", 0), ("worker", 0), ("beat", active_beat)):
            fleet.kill(kind, n)
        booked_at_kill = len(booked)
        await asyncio.to_thread(wait_for, lambda: len(booked) >= booked_at_kill + 4, 90, 0.2,
                                "four more bookings after the kill")
        await asyncio.sleep(2 * ALERT_PERIOD + BEAT_LOCK)
        stop_load.set()
        for thread in load:
            await asyncio.to_thread(thread.join)
        stop_sockets.set()
        await asyncio.gather(*watchers)
        return received, booked_at_kill

    try:
        received, booked_at_kill = asyncio.run(scenario())
        wait_for(lambda: set(Reservation.objects.filter(pk__in=booked).values_list("state", flat=True)) == {"released"},
                 timeout=30, message="every booking released")
    finally:
        fleet.stop()

    assert failures == []
    assert all(str(fleet.web[0]) in line for line in refused)  # only the killed replica refused anything
    assert len(booked) >= booked_at_kill + 4
    # The socket that was on the killed ws replica came back on the other one and kept receiving.
    after_kill = set(util_posted_after_kill)
    assert {util for url, util in received[0] if url == fleet.ws[1]} & after_kill
    assert {util for url, util in received[1] if url == fleet.ws[1]} & after_kill
    # No periodic task skipped (beyond the lock's hand-over) or doubled by the two beats.
    for task, period in (("sweep reservations", SWEEP_PERIOD), ("evaluate alert rules", ALERT_PERIOD)):
        sends = _sends(fleet.beat_logs, task)
        gaps = [(b - a).total_seconds() for a, b in itertools.pairwise(sends)]
        assert len(sends) >= 4, task
        assert max(gaps) < period + BEAT_LOCK + BEAT_TICK + 1.5, (task, max(gaps))
        assert min(gaps) > period / 2, (task, min(gaps))
