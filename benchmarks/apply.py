"""Apply benchmark: `python -m benchmarks.apply --json FILE`.

Measures how fast a reservation is enforced where its GPUs are, through the real code
paths: `allocations.services.reservation_create` / `reservation_release`, apply and undo
jobs (`allocations/apply/jobs.py`) run by a real Celery worker process
(`celery -A config worker -B --pool=solo`), on PostgreSQL and Redis.

* Kubernetes: a real control plane (`scripts/kube-control-plane start DIR`, v1.20.2) with
  GPU Nodes created through the API (there is no kubelet), registered as a cluster with its
  kubeconfig, discovered into Node/Gpu/pool rows (`discover_cluster`); the Kubernetes
  backend applies each reservation as the team's ResourceQuota. Measured: creation →
  `active`, and release → the quota's `requests.nvidia.com/gpu` back to what it was before
  (read from the API server).
* Bare metal: a real portal server (`python -m config.web`, or uvicorn when the agent has the WebSocket
  lease channel) and a real `python -m agent --simulate 8xH100` process. Measured:
  creation → `active` (which needs the agent's acknowledgement), and release → the host's
  lease report (`HostLeaseReport`, what the agent says it holds) without the reservation's
  leases.
* The agent process itself: resident memory (VmRSS, VmHWM) and CPU (utime + stime over a
  window) from /proc while it runs with 8 simulated GPUs, telemetry on and a lease held.

Reservations run one after another (so each figure is one reservation's own latency), after
a few warm-up ones that are not counted. Times are taken by the benchmark process: it calls
the service, then polls the database (every 10 ms) or the API server (every 20 ms), so
figures include up to one poll interval. Needs DATABASE_URL (PostgreSQL), REDIS_URL and
SECRET_KEY; `--fresh-db` drops and recreates that database (its name must contain "bench")
and empties that Redis database first.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from pathlib import Path

from benchmarks.api import ROOT, _django, _pct

PREFIX = "applybench"
TARGETS_MS = {"kubernetes": 1000.0, "agent": 2000.0}
AGENT_RSS_TARGET_MB = 50.0
AGENT_CPU_TARGET_PCT = 2.0
DB_POLL_S = 0.01
KUBE_POLL_S = 0.02
SETTINGS_SHOWN = ("APPLY_RETRY_BASE_SECONDS", "APPLY_RETRY_CAP_SECONDS", "APPLY_DEADLINE", "AGENT_HEARTBEAT_SECONDS",
                  "RESERVATION_SWEEP_SECONDS", "RECONCILE_SECONDS", "HOST_SILENCE_TIMEOUT",
                  "HOST_SILENCE_CHECK_SECONDS", "CLUSTER_DISCOVERY_SECONDS", "KUBE_REQUEST_TIMEOUT_SECONDS")


# --- pure parts (tested in tests/benchmarks) ------------------------------------------------------

@dataclass
class Sample:
    """One reservation's trip. Times in ms; None where the step did not finish."""

    create_to_active_ms: float | None = None
    release_to_clean_ms: float | None = None
    release_to_released_ms: float | None = None  # until the reservation row says released
    apply_attempts: int = 0
    undo_attempts: int = 0
    error: str = ""


def summarize(values: list[float]) -> dict:
    """p50/p95/max/mean of a list of milliseconds (nearest rank, as benchmarks.api)."""
    if not values:
        return {"n": 0, "p50": None, "p95": None, "max": None, "mean": None}
    return {"n": len(values), "p50": round(_pct(values, 50), 1), "p95": round(_pct(values, 95), 1),
            "max": round(max(values), 1), "mean": round(sum(values) / len(values), 1)}


def phase_summary(samples: list[Sample], target_ms: float) -> dict:
    """The JSON block of one backend: the keys the issue asks for, then the details."""
    done = [s for s in samples if not s.error]
    active = summarize([s.create_to_active_ms for s in done if s.create_to_active_ms is not None])
    clean = summarize([s.release_to_clean_ms for s in done if s.release_to_clean_ms is not None])
    released = summarize([s.release_to_released_ms for s in done if s.release_to_released_ms is not None])
    met = (bool(done) and len(done) == len(samples) and active["p95"] is not None and clean["p95"] is not None
           and active["p95"] <= target_ms and clean["p95"] <= target_ms)
    return {
        "create_to_active_ms_p50": active["p50"], "create_to_active_ms_p95": active["p95"],
        "release_to_clean_ms_p50": clean["p50"], "release_to_clean_ms_p95": clean["p95"],
        "n": len(done),
        "failures": [s.error for s in samples if s.error],
        "create_to_active_ms": active, "release_to_clean_ms": clean, "release_to_released_ms": released,
        "apply_attempts_mean": round(sum(s.apply_attempts for s in done) / len(done), 2) if done else None,
        "undo_attempts_mean": round(sum(s.undo_attempts for s in done) / len(done), 2) if done else None,
        "target_p95_ms": target_ms, "target_met": met,
    }


def parse_status_kb(text: str) -> dict[str, int]:
    """VmRSS / VmHWM (kB) from the text of /proc/<pid>/status."""
    out = {}
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            out[key] = int(value.split()[0])
    return out


def parse_stat_ticks(text: str) -> int:
    """utime + stime (clock ticks, all threads) from the text of /proc/<pid>/stat."""
    fields = text[text.rindex(")") + 2:].split()  # the command name may hold spaces and parentheses
    return int(fields[11]) + int(fields[12])  # fields 14 and 15 of proc(5), counted from the state (field 3)


def cpu_pct(ticks: int, seconds: float, clk_tck: int) -> float:
    """CPU used over `seconds` as a percentage of one core."""
    return 100.0 * ticks / clk_tck / seconds if seconds > 0 else 0.0


@dataclass
class ProcSnapshot:
    at: float  # time.monotonic()
    ticks: int
    rss_kb: int
    hwm_kb: int


def proc_snapshot(pid: int) -> ProcSnapshot:
    status = parse_status_kb(Path(f"/proc/{pid}/status").read_text())
    return ProcSnapshot(time.monotonic(), parse_stat_ticks(Path(f"/proc/{pid}/stat").read_text()),
                        status.get("VmRSS", 0), status.get("VmHWM", 0))


def footprint(first: ProcSnapshot, last: ProcSnapshot, *, gpus: int, clk_tck: int,
              rss_samples_kb: list[int] | None = None) -> dict:
    seconds = last.at - first.at
    block = {"rss_mb": round(last.rss_kb / 1024, 1), "peak_rss_mb": round(last.hwm_kb / 1024, 1),
             "cpu_pct_one_core": round(cpu_pct(last.ticks - first.ticks, seconds, clk_tck), 2),
             "gpus": gpus, "seconds": round(seconds, 1)}
    if rss_samples_kb:
        block["rss_mb_max_sampled"] = round(max(rss_samples_kb) / 1024, 1)
    block["rss_target_mb"], block["cpu_target_pct"] = AGENT_RSS_TARGET_MB, AGENT_CPU_TARGET_PCT
    block["target_met"] = block["peak_rss_mb"] < AGENT_RSS_TARGET_MB and block["cpu_pct_one_core"] < AGENT_CPU_TARGET_PCT
    return block


def lease_path(root: Path) -> str:
    """'websocket' when the portal serves the agents' lease channel (then it must run under ASGI).
    The routes live in config/ (portal/ in commits before the wiring had its own package)."""
    has_route = any(routing.exists() and "ws/agent/" in routing.read_text()
                    for routing in (root / "config" / "routing.py", root / "portal" / "routing.py"))
    return "websocket" if has_route and (root / "agent" / "lease_channel.py").exists() else "http-poll"


def format_table(result: dict) -> str:
    def ms(value) -> str:
        return "-" if value is None else f"{value:.0f}"

    lines = [f"{'backend':<12}{'n':>4}{'create→active p50':>19}{'p95':>8}{'release→clean p50':>19}{'p95':>8}"
             f"{'target p95':>12}  met"]
    for name in ("kubernetes", "agent"):
        row = result.get(name)
        if not row:
            continue
        lines.append(f"{name:<12}{row['n']:>4}{ms(row['create_to_active_ms_p50']):>19}"
                     f"{ms(row['create_to_active_ms_p95']):>8}{ms(row['release_to_clean_ms_p50']):>19}"
                     f"{ms(row['release_to_clean_ms_p95']):>8}{ms(row['target_p95_ms']):>12}  "
                     f"{'yes' if row['target_met'] else 'NO'}")
    process = result.get("agent_process")
    if process:
        lines.append(f"agent process ({process['gpus']} simulated GPUs, {process['seconds']:.0f} s): RSS "
                     f"{process['rss_mb']} MB, peak {process['peak_rss_mb']} MB (target < {AGENT_RSS_TARGET_MB:g}), "
                     f"CPU {process['cpu_pct_one_core']}% of one core (target < {AGENT_CPU_TARGET_PCT:g}%): "
                     f"{'met' if process['target_met'] else 'MISSED'}")
    return "\n".join(lines)


# --- machine and settings -----------------------------------------------------------------------

def machine_info(root: Path) -> dict:
    info = {"platform": platform.platform(), "python": platform.python_version(), "cpus": os.cpu_count(),
            "loadavg_at_start": list(os.getloadavg())}
    try:
        model = next(line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                     if line.startswith("model name"))
        info["cpu_model"] = model
        mem = next(line for line in Path("/proc/meminfo").read_text().splitlines() if line.startswith("MemTotal"))
        info["memory_gb"] = round(int(mem.split()[1]) / 1024 / 1024, 1)
    except (OSError, StopIteration):
        pass
    info["code"] = str(root)
    if (root / ".git").exists():
        try:
            head = subprocess.run(["git", "-C", str(root), "log", "-1", "--format=%h %s"], capture_output=True,
                                  text=True, timeout=10).stdout.strip()
            dirty = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--", "agent", "allocations",
                                    "inventory", "teams", "config", "portal"], capture_output=True, text=True, timeout=10).stdout
            info["git_head"] = head
            info["uncommitted_in_code_under_test"] = sorted(line[3:] for line in dirty.splitlines())
        except (OSError, subprocess.SubprocessError):
            pass
    elif (root / "REVISION").exists():  # an export (`git archive`) of one commit, which says which
        info["git_head"] = (root / "REVISION").read_text().strip()
        info["uncommitted_in_code_under_test"] = []
    return info


def db_connections() -> int:
    """Open PostgreSQL connections to this database (all processes)."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()")
        return int(cursor.fetchone()[0])


def settings_used() -> dict:
    from django.conf import settings
    from django.db import connection

    out = {}
    for name in SETTINGS_SHOWN:
        value = getattr(settings, name, None)
        out[name] = value.total_seconds() if isinstance(value, timedelta) else value
    with connection.cursor() as cursor:
        cursor.execute("SHOW server_version")
        out["postgresql"] = cursor.fetchone()[0]
    return out


# --- processes --------------------------------------------------------------------------------------

class Stack:
    """The processes the benchmark starts; all stopped in `close`."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.processes: list[tuple[str, subprocess.Popen]] = []
        self.env = dict(os.environ, PYTHONUNBUFFERED="1", LOG_LEVEL="WARNING", PORTAL_VAR_DIR=str(workdir / "var"))
        (workdir / "var").mkdir(parents=True, exist_ok=True)
        self.kube_dir: Path | None = None

    def spawn(self, name: str, argv: list[str], env: dict | None = None) -> subprocess.Popen:
        log = open(self.workdir / f"{name}.log", "ab")
        process = subprocess.Popen(argv, cwd=ROOT, env=env or self.env, stdout=log, stderr=subprocess.STDOUT)
        self.processes.append((name, process))
        return process

    def worker(self) -> subprocess.Popen:
        process = self.spawn("worker", [sys.executable, "-m", "celery", "-A", "config", "worker", "-B", "--pool=solo",
                                        "--loglevel=WARNING", "--without-mingle", "--without-gossip",
                                        "-s", str(self.workdir / "var" / "celerybeat-schedule")])
        from config.celery import app

        for _ in range(120):
            if process.poll() is not None:
                raise SystemExit(f"the Celery worker exited; see {self.workdir / 'worker.log'}")
            if app.control.ping(timeout=0.5):
                return process
        raise SystemExit("the Celery worker did not answer a ping within 60 s")

    def portal(self, server: str, port: int) -> str:
        import socket

        with socket.socket() as probe:  # another portal answering on the port would be measured instead
            if probe.connect_ex(("127.0.0.1", port)) == 0:
                raise SystemExit(f"port {port} is in use; pick another with --port")
        if server == "uvicorn":
            argv = [sys.executable, "-m", "uvicorn", "config.asgi:application", "--host", "127.0.0.1",
                    "--port", str(port), "--log-level", "warning", "--no-access-log"]
        else:  # the Procfile's web process, as benchmarks.api runs it
            argv = [sys.executable, "-m", "config.web", "--port", str(port), "--log-level", "warning"]
        process = self.spawn(server, argv)
        base = f"http://127.0.0.1:{port}"
        for _ in range(240):
            if process.poll() is not None:
                raise SystemExit(f"{server} exited; see {self.workdir / (server + '.log')}")
            try:
                with urllib.request.urlopen(f"{base}/readyz", timeout=2) as response:
                    if response.status == 200:
                        return base
            except OSError:
                time.sleep(0.25)
        raise SystemExit(f"the portal ({server}) did not become ready")

    def kube_start(self) -> tuple[str, str]:
        self.kube_dir = self.workdir / "kube"
        started = subprocess.run([str(ROOT / "scripts" / "kube-control-plane"), "start", str(self.kube_dir)],
                                 capture_output=True, text=True, timeout=900)
        if started.returncode != 0:
            self.kube_stop()
            raise SystemExit("the Kubernetes control plane did not start:\n" + started.stderr[-3000:])
        env = dict(line.split("=", 1) for line in started.stdout.splitlines() if "=" in line)
        return (self.kube_dir / "kubeconfig").read_text(), env["KUBE_SERVER"]

    def kube_stop(self) -> None:
        if self.kube_dir is not None:
            subprocess.run([str(ROOT / "scripts" / "kube-control-plane"), "stop", str(self.kube_dir)],
                           capture_output=True, timeout=120)
            self.kube_dir = None

    def close(self) -> None:
        for _, process in reversed(self.processes):
            if process.poll() is None:
                process.terminate()
        for name, process in reversed(self.processes):
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(timeout=10)
        self.kube_stop()


def fresh_database() -> None:
    """Drop and recreate the benchmark's database and empty its Redis database."""
    import psycopg
    import redis

    url = urllib.parse.urlsplit(os.environ["DATABASE_URL"])
    name = url.path.lstrip("/")
    if "bench" not in name:
        raise SystemExit(f"--fresh-db drops the database; {name!r} does not look like a benchmark database")
    with psycopg.connect(host=url.hostname, port=url.port or 5432, user=url.username, password=url.password,
                         dbname="postgres", autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{name}"')
    redis.Redis.from_url(os.environ["REDIS_URL"]).flushdb()


# --- one reservation's trip --------------------------------------------------------------------------

def wait_for(check, timeout: float, interval: float):
    """Call `check` until it returns something true; returns (value, seconds waited) or (None, None)."""
    started = time.perf_counter()
    while True:
        value = check()
        if value:
            return value, time.perf_counter() - started
        if time.perf_counter() - started > timeout:
            return None, None
        time.sleep(interval)


def reservation_trip(*, member, team, pool, gpus: int, is_clean, timeout: float, before=None,
                     poll: float = DB_POLL_S) -> Sample:
    """Create a reservation starting now, wait for active; release it, wait until `is_clean(reservation_id)`.

    `before()`, if given, runs first (outside the timing): it notes the state "clean" returns to. After the
    release, `is_clean` and the reservation's state are polled every `poll` seconds."""
    from allocations.models import ApplyJob, Reservation
    from allocations.services import ReservationRequest, reservation_create, reservation_release

    State = Reservation.State
    sample = Sample()
    if before is not None:
        before()
    started = time.perf_counter()
    reservation = reservation_create(actor=member, request=ReservationRequest(
        team=team.slug, pool=pool.slug, gpus=gpus, ends_at=datetime.now(timezone.utc) + timedelta(hours=1)))
    rid = reservation.pk

    def state_is(*states):
        def check():
            state = Reservation.objects.filter(pk=rid).values_list("state", flat=True).first()
            if state == State.FAILED:
                raise RuntimeError(Reservation.objects.get(pk=rid).reason)
            return state in states
        return check

    try:
        ok, _ = wait_for(state_is(State.ACTIVE), timeout, DB_POLL_S)
        if not ok:
            sample.error = f"reservation {rid} not active after {timeout:g} s"
            return sample
        sample.create_to_active_ms = (time.perf_counter() - started) * 1000
        released_at = time.perf_counter()
        reservation_release(actor=member, reservation_id=rid)
        clean_at = released_state_at = None
        deadline = released_at + timeout
        while (clean_at is None or released_state_at is None) and time.perf_counter() < deadline:
            if clean_at is None and is_clean(rid):
                clean_at = time.perf_counter()
            if released_state_at is None and state_is(State.RELEASED)():
                released_state_at = time.perf_counter()
            time.sleep(poll)
        if clean_at is None or released_state_at is None:
            sample.error = f"reservation {rid} not clean/released {timeout:g} s after its release"
            return sample
        sample.release_to_clean_ms = (clean_at - released_at) * 1000
        sample.release_to_released_ms = (released_state_at - released_at) * 1000
    except RuntimeError as failed:
        sample.error = f"reservation {rid} failed: {failed}"
        return sample
    finally:
        attempts = dict(ApplyJob.objects.filter(reservation_id=rid).values_list("action", "attempts"))
        sample.apply_attempts = attempts.get(ApplyJob.Action.APPLY, 0)
        sample.undo_attempts = attempts.get(ApplyJob.Action.UNDO, 0)
    return sample


def run_trips(name: str, count: int, warmup: int, **trip) -> list[Sample]:
    for _ in range(warmup):
        warm = reservation_trip(**trip)
        if warm.error:
            raise SystemExit(f"{name}: warm-up reservation did not make it: {warm.error}")
    samples = []
    for i in range(count):
        samples.append(reservation_trip(**trip))
        last = samples[-1]
        if last.error:
            print(f"  {name} #{i + 1}: {last.error}", flush=True)
        elif (i + 1) % 10 == 0:
            print(f"  {name}: {i + 1}/{count} (last: active {last.create_to_active_ms:.0f} ms, "
                  f"clean {last.release_to_clean_ms:.0f} ms)", flush=True)
    return samples


# --- fixtures -----------------------------------------------------------------------------------------

def accounts(run: str):
    """A staff user (registers clusters, tokens, quotas) and the member who books."""
    from django.contrib.auth import get_user_model

    User = get_user_model()
    staff = User.objects.create_user(f"{PREFIX}-staff-{run}", is_staff=True)
    member = User.objects.create_user(f"{PREFIX}-member-{run}")
    return staff, member


def team_with_quota(staff, member, pool, slug: str, max_ge: int):
    from allocations.services import quota_set
    from teams.services import membership_add, team_create

    team = team_create(actor=staff, slug=slug, name=slug)
    membership_add(actor=staff, team=team, username=member.username)
    quota_set(actor=staff, team=team, pool=pool, max_ge=max_ge, ge_hours_per_month=None)
    return team


GFD_H100 = {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3", "nvidia.com/gpu.memory": "81559",
            "nvidia.com/mig.capable": "true", "nvidia.com/cuda.driver.major": "535",
            "nvidia.com/cuda.driver.minor": "104", "nvidia.com/cuda.runtime.major": "12",
            "nvidia.com/cuda.runtime.minor": "2"}


def make_gpu_node(core, name: str, gpus: int) -> None:
    """A Node as a kubelet plus the NVIDIA device plugin and GFD report it (as tests/kubernetes/conftest.py)."""
    core.create_node({"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": {
        "kubernetes.io/hostname": name, "kubernetes.io/os": "linux", **GFD_H100, "nvidia.com/gpu.count": str(gpus)}}})
    resources = {"cpu": "64", "memory": "512Gi", "pods": "110", "nvidia.com/gpu": str(gpus)}
    core.patch_node_status(name, {"status": {"capacity": resources, "allocatable": resources, "conditions": [
        {"type": "Ready", "status": "True", "reason": "KubeletReady", "message": "kubelet is posting ready status"}]}})


# --- the two backends ----------------------------------------------------------------------------------

def kubernetes_phase(stack: Stack, *, staff, member, run: str, args) -> dict:
    import yaml
    from kubernetes import client as k8s
    from kubernetes.config.kube_config import new_client_from_config_dict

    from allocations.apply.backends.kubernetes_manifests import QUOTA_NAME
    from allocations.apply.desired import team_namespace
    from inventory.kubernetes.discovery import discover_cluster
    from inventory.kubernetes.nodes import parse_quantity
    from inventory.models import GpuPool
    from inventory.services import cluster_create

    kubeconfig, server = stack.kube_start()
    api = new_client_from_config_dict(yaml.safe_load(kubeconfig), persist_config=False)
    core = k8s.CoreV1Api(api)
    try:
        for n in range(2):
            make_gpu_node(core, f"{PREFIX}-gpu-{n}", 8)
        cluster = cluster_create(actor=staff, name=f"{PREFIX} kube {run}", kind="kubernetes", kubeconfig=kubeconfig)
        discovered = discover_cluster(cluster)
        pool = GpuPool.objects.filter(gpus__node__cluster=cluster).distinct().get()
        team = team_with_quota(staff, member, pool, f"{PREFIX}-k8s-{run}", max_ge=16)
        namespace = team_namespace(team.slug)
        print(f"Kubernetes {server}: cluster {cluster.slug}, pool {pool.slug} ({pool.gpus.count()} GPUs, "
              f"discovery: {len(getattr(discovered, 'changes', []) or [])} change(s)), namespace {namespace}",
              flush=True)

        def read_or_zero() -> float:
            """The quota's spec.hard requests.nvidia.com/gpu now (0 while the quota does not exist)."""
            try:
                response = core.read_namespaced_resource_quota(QUOTA_NAME, namespace, _preload_content=False)
            except k8s.ApiException as error:
                if error.status == 404:
                    return 0.0
                raise
            hard = (json.loads(response.data).get("spec") or {}).get("hard") or {}
            return float(parse_quantity(hard.get("requests.nvidia.com/gpu", "0")))

        baseline = {"value": 0.0}

        def note_before() -> None:
            baseline["value"] = read_or_zero()

        def is_clean(_rid: int) -> bool:
            return read_or_zero() == baseline["value"]

        samples = run_trips("kubernetes", args.reservations, args.warmup, member=member, team=team, pool=pool,
                            gpus=args.gpus, is_clean=is_clean, timeout=args.timeout, before=note_before,
                            poll=KUBE_POLL_S)
        block = phase_summary(samples, TARGETS_MS["kubernetes"])
        block.update({"server": server, "version": "v1.20.2", "cluster": cluster.slug, "nodes": 2,
                      "gpus_per_reservation": args.gpus, "clean_means": "ResourceQuota requests.nvidia.com/gpu "
                      "(spec.hard) back to its value before the reservation, read from the API server"})
        return block
    finally:
        api.close()



def agent_phase(stack: Stack, *, staff, member, run: str, args) -> tuple[dict, dict, dict]:
    from django.conf import settings

    from allocations.models import HostLeaseReport, Reservation
    from allocations.services import ReservationRequest, reservation_create, reservation_release
    from inventory.models import GpuPool, Node
    from inventory.services import cluster_create, host_token_create

    path = lease_path(ROOT)
    server = args.server if args.server != "auto" else ("uvicorn" if path == "websocket" else "web")
    cluster = cluster_create(actor=staff, name=f"{PREFIX} metal {run}", kind="baremetal")
    host = f"{PREFIX}-host-{run}"
    _, key = host_token_create(actor=staff, cluster=cluster, host_name=host)
    base = stack.portal(server, args.port)

    usage = subprocess.run([sys.executable, "-m", "agent", "--help"], cwd=ROOT, capture_output=True, text=True,
                           timeout=60).stdout
    state = stack.workdir / "agent-state"
    where = ["--state-dir", str(state)] if "--state-dir" in usage else ["--lease-file", str(state / "leases.json")]
    argv = [sys.executable, "-m", "agent", "--portal", base, "--token", key, "--simulate", f"{args.agent_gpus}xH100",
            "--hostname", host, *where, "--log-level", "WARNING"]
    if args.agent_http_poll:
        if "--no-lease-channel" not in usage:
            raise SystemExit("--agent-http-poll: this agent has no --no-lease-channel option")
        argv.append("--no-lease-channel")
        path = "http-poll (agent run with --no-lease-channel)"
    agent = stack.spawn("agent", argv)
    node, _ = wait_for(lambda: Node.objects.filter(cluster=cluster, name=host, last_seen_at__isnull=False,
                                                   gpus__isnull=False).distinct().first(), 60, 0.1)
    if node is None or agent.poll() is not None:
        raise SystemExit(f"the agent did not register; see {stack.workdir / 'agent.log'}")
    wait_for(lambda: node.gpus.count() == args.agent_gpus, 30, 0.1)
    pool = GpuPool.objects.filter(gpus__node=node).distinct().get()
    team = team_with_quota(staff, member, pool, f"{PREFIX}-metal-{run}", max_ge=args.agent_gpus)
    print(f"Agent: portal {base} ({server}), lease path {path}, host {host} (node {node.pk}, "
          f"{node.gpus.count()} simulated GPUs, pool {pool.slug}), agent pid {agent.pid}", flush=True)

    def is_clean(rid: int) -> bool:
        held = HostLeaseReport.objects.filter(node=node).values_list("held", flat=True).first() or []
        return not any(lease.startswith(f"{rid}:") for lease in held)

    trip = {"member": member, "team": team, "pool": pool, "gpus": args.gpus, "is_clean": is_clean,
            "timeout": args.timeout}
    # Warm up first (the lease channel connects, the first leases are written), then measure the agent
    # alone for a window while it holds one reservation's leases, with telemetry on as in production.
    for _ in range(args.warmup):
        warm = reservation_trip(**trip)
        if warm.error:
            raise SystemExit(f"agent: warm-up reservation did not make it: {warm.error}")
    held = reservation_create(actor=member, request=ReservationRequest(
        team=team.slug, pool=pool.slug, gpus=args.gpus, ends_at=datetime.now(timezone.utc) + timedelta(hours=1)))
    if not wait_for(lambda: Reservation.objects.filter(pk=held.pk, state=Reservation.State.ACTIVE).exists(),
                    args.timeout, DB_POLL_S)[0]:
        raise SystemExit("agent: the reservation held during the footprint window did not become active")
    clk_tck = os.sysconf("SC_CLK_TCK")
    print(f"  measuring the agent process for {args.agent_seconds:g} s ...", flush=True)
    first, rss, connections = proc_snapshot(agent.pid), [], [db_connections()]
    end = first.at + args.agent_seconds
    while time.monotonic() < end:
        time.sleep(min(1.0, max(0.0, end - time.monotonic())))
        rss.append(proc_snapshot(agent.pid).rss_kb)
        connections.append(db_connections())
    quiet = footprint(first, proc_snapshot(agent.pid), gpus=args.agent_gpus, clk_tck=clk_tck, rss_samples_kb=rss)
    quiet["while"] = (f"idle but holding {args.gpus} GPU lease(s), telemetry every 1 s, heartbeat "
                      f"{settings.AGENT_HEARTBEAT_SECONDS:g} s")
    reservation_release(actor=member, reservation_id=held.pk)
    wait_for(lambda: is_clean(held.pk), args.timeout, DB_POLL_S)

    busy_first = proc_snapshot(agent.pid)
    samples = run_trips("agent", args.reservations, 0, **trip)
    busy = footprint(busy_first, proc_snapshot(agent.pid), gpus=args.agent_gpus, clk_tck=clk_tck)
    busy["while"] = "the latency run (reservations applied and released one after another)"
    if agent.poll() is not None:
        raise SystemExit(f"the agent exited during the run ({agent.returncode}); see {stack.workdir / 'agent.log'}")

    block = phase_summary(samples, TARGETS_MS["agent"])
    connections.append(db_connections())
    block.update({"db_connections": {"window_start": connections[0], "window_max": max(connections),
                                     "window_end": connections[-2], "after_run": connections[-1]},
                  "server": server, "lease_path": path, "portal": base, "host": host,
                  "simulated_gpus": args.agent_gpus, "gpus_per_reservation": args.gpus,
                  "agent_heartbeat_seconds": settings.AGENT_HEARTBEAT_SECONDS,
                  "clean_means": "the host's lease report (HostLeaseReport.held, what the agent says it holds) "
                                 "without any lease of the reservation"})
    return block, quiet, busy


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", type=Path, help="write the results here")
    parser.add_argument("--reservations", type=int, default=50, help="measured reservations per backend")
    parser.add_argument("--warmup", type=int, default=2, help="reservations run first and not counted")
    parser.add_argument("--gpus", type=int, default=2, help="GPUs per reservation")
    parser.add_argument("--agent-gpus", type=int, default=8, help="simulated H100s on the agent's host")
    parser.add_argument("--agent-seconds", type=float, default=60, help="window for the agent's CPU and memory")
    parser.add_argument("--timeout", type=float, default=120, help="give up on one step after this long")
    parser.add_argument("--server", choices=("auto", "web", "uvicorn"), default="auto",
                        help="portal server for the agent (auto: uvicorn when the WebSocket lease channel exists)")
    parser.add_argument("--port", type=int, default=8078)
    parser.add_argument("--fresh-db", action="store_true",
                        help="drop and recreate DATABASE_URL's database (name must contain 'bench'), empty REDIS_URL's")
    parser.add_argument("--skip-kubernetes", action="store_true")
    parser.add_argument("--skip-agent", action="store_true")
    parser.add_argument("--agent-http-poll", action="store_true",
                        help="run the agent with --no-lease-channel: measure the HTTP polling fallback")
    args = parser.parse_args(argv)

    if not os.environ.get("DATABASE_URL", "").startswith("postgres") or not os.environ.get("REDIS_URL"):
        raise SystemExit("set DATABASE_URL (PostgreSQL), REDIS_URL and SECRET_KEY: the worker and the portal "
                         "run as separate processes")
    if args.fresh_db:
        fresh_database()
    _django()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)
    run = datetime.now(timezone.utc).strftime("%H%M%S")
    workdir = Path(tempfile.mkdtemp(prefix=f"{PREFIX}-"))
    result: dict = {"command": "python -m benchmarks.apply " + " ".join(argv if argv is not None else sys.argv[1:]),
                    "started_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
                    "machine": machine_info(ROOT), "settings": settings_used(),
                    "reservations_each": args.reservations, "warmup_each": args.warmup,
                    "poll_interval_ms": {"database": DB_POLL_S * 1000, "kubernetes_api": KUBE_POLL_S * 1000}}
    print("Settings: " + ", ".join(f"{k}={v}" for k, v in result["settings"].items()), flush=True)
    print(f"Processes and logs in {workdir}", flush=True)
    stack = Stack(workdir)
    failed = False
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # run the `finally` below: stop what we started
    try:
        stack.worker()
        staff, member = accounts(run)
        if not args.skip_kubernetes:
            result["kubernetes"] = kubernetes_phase(stack, staff=staff, member=member, run=run, args=args)
        if not args.skip_agent:
            result["agent"], result["agent_process"], result["agent_process_during_latency_run"] = agent_phase(
                stack, staff=staff, member=member, run=run, args=args)
    finally:
        stack.close()
    result["finished_at"] = datetime.now(timezone.utc).isoformat(timespec="seconds")
    result["machine"]["loadavg_at_end"] = list(os.getloadavg())
    for name in ("kubernetes", "agent"):
        failed |= bool(result.get(name, {}).get("failures"))

    print(f"\nApply benchmark: {args.reservations} reservations of {args.gpus} GPU(s) per backend, one at a time, "
          f"after {args.warmup} warm-up; times in ms")
    print(format_table(result))
    if "agent" in result:
        print(f"agent half: portal under {result['agent']['server']}, lease path {result['agent']['lease_path']}")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=2))
        print(f"JSON: {args.json}")
    if failed:
        print(f"some reservations failed; logs kept in {workdir}")
    else:
        shutil.rmtree(workdir, ignore_errors=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
