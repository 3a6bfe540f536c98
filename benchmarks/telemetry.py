"""Telemetry benchmark: `python -m benchmarks.telemetry --gpus N --clients M --seconds S --json FILE`.

Drives N simulated GPUs at 1 Hz through the real ingest path (HTTP POST
/api/v1/agent/telemetry/ with per-host tokens, as `python -m agent` sends them) and M
WebSocket clients (DRF tokens, each watching one pool at /ws/pools/<slug>/) against a
portal it starts under uvicorn, and prints samples/s ingested and sample-to-client
latency p50/p95/p99: from the moment an agent stamps a batch (`t`, just before its POST)
to the moment a client has the message carrying it. Everything runs on one machine, so
the load generator competes with the portal, PostgreSQL and Redis for the same cores;
`--gpus-per-agent` sets how many GPUs one agent request carries.

In redis mode a baseline runs first, beside the measurement and on the same clients: a bare
Channels fan-out (one process publishing a telemetry-sized message to every pool group once
a second through the portal's channel layer, no ingest behind it), reported as
baseline_fanout_latency_ms_p50/p95 with the ratio of the run's p95 to it.

Modes: `redis` (PostgreSQL from DATABASE_URL, Redis channel layer and cache from
REDIS_URL: production's path) and `embedded` (SQLite, in-memory channel layer and
local-memory cache in one process). The JSON has samples_per_s, latency_ms_p50/p95/p99,
gpus, clients, mode, and the details (ingest request latency, messages, errors).
"""
from __future__ import annotations

import argparse
import asyncio
import heapq
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import orjson

from agent.telemetry import (
    BATCHES_PER_REQUEST,
    BUFFER_BATCHES,
    SOCKET_BACKOFF_CAP_SECONDS,
    SOCKET_RETRY_SECONDS,
    TIMEOUTS_BEFORE_HTTP,
)
from benchmarks.common import cpu_seconds as _cpu_seconds
from benchmarks.common import free_port as _free_port

ROOT = Path(__file__).resolve().parent.parent
PREFIX = "bench-tm"


# --- fixtures (run in a subprocess with the mode's environment) ----------------------------

def prepare(gpus: int, per_agent: int, pools: int) -> dict:
    """Create the benchmark fleet (idempotently): hosts of `per_agent` GPUs, `pools` pools, a staff token."""
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
    import django

    django.setup()
    from django.contrib.auth import get_user_model
    from django.core.management import call_command
    from django.db import connection, transaction

    from inventory import services
    from inventory.models import Cluster, Gpu, GpuPool, HostToken, Node
    from monitoring.models import Sample
    from teams.services import api_token_create

    call_command("migrate", verbosity=0)
    User = get_user_model()
    with transaction.atomic():
        staff, _ = User.objects.get_or_create(username=f"{PREFIX}-staff", defaults={"is_staff": True})
        Cluster.objects.filter(slug=PREFIX).delete()
        if connection.vendor == "postgresql":
            # TRUNCATE, not DELETE: a table full of dead rows would be vacuumed during the run.
            with connection.cursor() as cursor:
                cursor.execute(f"TRUNCATE {Sample._meta.db_table}")
        else:
            Sample.objects.all().delete()
        cluster = Cluster.objects.create(name=PREFIX, slug=PREFIX, kind=Cluster.Kind.BAREMETAL)
        pool_objs = [GpuPool.objects.get_or_create(slug=f"{PREFIX}-{j}", defaults={"name": f"{PREFIX} {j}"})[0]
                     for j in range(pools)]
        agents = []
        for i in range((gpus + per_agent - 1) // per_agent):
            count = min(per_agent, gpus - i * per_agent)
            node = Node.objects.create(cluster=cluster, name=f"host-{i:05d}", last_seen_at=None)
            pool = pool_objs[i % pools]
            rows = Gpu.objects.bulk_create(
                Gpu(node=node, pool=pool, index=k, uuid=f"GPU-bench-{i:05d}-{k:04d}-0000", model_name="NVIDIA H100",
                    memory_mib=81559) for k in range(count))
            HostToken.objects.filter(cluster=cluster, host_name=node.name).delete()
            _, key = services.host_token_create(actor=staff, cluster=cluster, host_name=node.name)
            agents.append({"key": key, "uuids": [g.uuid for g in rows], "pool": pool.slug})
        _, token = api_token_create(user=staff, name="benchmark")
    from monitoring import live

    return {"agents": agents, "pools": [p.slug for p in pool_objs], "token": token,
            "pool_groups": [live.group_name("pool", p.pk) for p in pool_objs]}


# --- baseline: a bare Channels fan-out ------------------------------------------------------

def publish_baseline(groups: list[str], per_message: int, seconds: float) -> None:
    """Publish to each group once a second, at its own phase within the second, a message the size
    and shape of a telemetry message carrying `per_message` GPUs, through the portal's channel layer
    (common.channel_layer.send_to_groups, as the ingest does), with no ingest behind it. The clients
    time these as they time telemetry: what the fan-out alone costs on this machine right now."""
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
    import django

    django.setup()
    from common.channel_layer import send_to_groups
    from monitoring import live

    item = {"gpu": 0, "uuid": "GPU-bench-baseline-0000-0000", "t": 0.0, "util": 50, "mem_util": 25,
            "mem_used": 40000, "mem_total": 81559, "temp": 60, "power": 400.0}
    start = time.time()
    end = start + seconds
    due = [(start + i / len(groups), group) for i, group in enumerate(groups)]  # ascending: a valid heap
    while due and due[0][0] < end:
        at, group = heapq.heappop(due)
        time.sleep(max(0.0, at - time.time()))
        t = time.time()
        samples = [dict(item, gpu=k, t=t) for k in range(per_message)]
        send_to_groups({group: {"type": live.EVENT, "text": orjson.dumps(
            {"type": "telemetry.samples", "t": t, "samples": samples}).decode()}})
        heapq.heappush(due, (at + 1.0, group))


# --- load --------------------------------------------------------------------------------

def _percentile(values: list[float], p: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, int(p / 100 * len(ordered)))], 1)


# As agent.telemetry.SocketPost and TelemetrySender: how long a send waits for its answer (the agent's client
# timeout), and the agent's own retry, backoff and buffer defaults.
SOCKET_TIMEOUT_SECONDS = 10.0

class SocketBusy(Exception):
    """The socket is in its backoff: the batches stay buffered (agent.portal_client.PortalUnreachable)."""


async def agent_loop(session, base: str, agent: dict, stats: dict, rng: random.Random, period: float = 1.0,
                     socket_base: str | None = None) -> None:
    """One host: every `period` seconds (the agent's default: 1), one batch of all its GPUs, sent as
    `python -m agent` sends it: a text frame on /ws/agent/telemetry/ of `socket_base` (the ws process)
    when given, awaiting its answer, else a POST to the web process. As the agent's SocketPost does:
    a socket that is refused sends over HTTP and is tried again SOCKET_RETRY_SECONDS later; one that times
    out (opening, or awaiting an answer) keeps its batches and is tried again after a doubling, jittered
    backoff, if the socket has answered before, or the host's lease channel is up (`agent["lease_channel_open"]`,
    set by the fleet benchmark), or for the first TIMEOUTS_BEFORE_HTTP timeouts in a row (then HTTP);
    one that closes or fails otherwise is dropped and opened again for the next batch."""
    import aiohttp

    headers = {"Authorization": f"Host {agent['key']}", "Content-Type": "application/json"}
    url = socket_base.replace("http", "ws", 1) + "/ws/agent/telemetry/" if socket_base is not None else None
    state: dict = {"socket": None, "retry_at": 0.0, "over_http": False, "answered": False, "busy_failures": 0}

    def count(name: str) -> None:
        stats["errors"][name] = stats["errors"].get(name, 0) + 1

    async def drop_socket() -> None:
        socket, state["socket"] = state["socket"], None
        agent["telemetry_socket_open"] = False  # as SocketPost.open_event (the fleet's heartbeats read it)
        if socket is not None:
            await socket.close()

    def back_off() -> None:
        state["busy_failures"] += 1
        state["over_http"] = False
        state["retry_at"] = time.monotonic() + min(SOCKET_BACKOFF_CAP_SECONDS,
                                                   2.0 ** state["busy_failures"]) * rng.uniform(0.5, 1.0)

    async def open_socket():
        if url is None or state["socket"] is not None or time.monotonic() < state["retry_at"]:
            return state["socket"]
        try:
            state["socket"] = await asyncio.wait_for(session.ws_connect(
                url, headers={"Authorization": f"Host {agent['key']}"}, heartbeat=None, max_msg_size=0),
                SOCKET_TIMEOUT_SECONDS)
            state["over_http"] = False
        except asyncio.TimeoutError:
            count("socket open:TimeoutError")
            if state["answered"] or agent.get("lease_channel_open") or state["busy_failures"] < TIMEOUTS_BEFORE_HTTP:
                back_off()
            else:
                state["over_http"], state["retry_at"] = True, time.monotonic() + SOCKET_RETRY_SECONDS
                state["busy_failures"] = 0
        except (OSError, aiohttp.ClientError) as error:
            count(f"socket open:{type(error).__name__}")
            state["over_http"], state["retry_at"] = True, time.monotonic() + SOCKET_RETRY_SECONDS
        return state["socket"]

    async def send(body: dict) -> tuple[int, dict]:
        socket = await open_socket()
        if socket is not None:
            try:
                await socket.send_str(orjson.dumps(body).decode())
                message = await asyncio.wait_for(socket.receive(), SOCKET_TIMEOUT_SECONDS)
            except asyncio.TimeoutError:
                await drop_socket()
                back_off()
                raise
            except (OSError, aiohttp.ClientError):
                await drop_socket()
                raise
            if message.type != aiohttp.WSMsgType.TEXT:  # the portal closed the socket
                await drop_socket()
                raise ConnectionError(f"telemetry socket: {message.type!r} {message.data!r}")
            answer = orjson.loads(message.data)
            if answer.get("type") == "ack":
                state["answered"], state["busy_failures"] = True, 0
                agent["telemetry_socket_open"] = True
                return 200, answer
            return answer.get("status", 0), answer
        if url is not None and not state["over_http"]:
            raise SocketBusy()
        if url is not None and stats["measuring"]:
            stats["sent_over_http"] = stats.get("sent_over_http", 0) + 1
        async with session.post(f"{base}/api/v1/agent/telemetry/", data=orjson.dumps(body),
                                headers=headers) as response:
            return response.status, await response.json(content_type=None)

    try:
        await _agent_ticks(send, agent, stats, rng, period)
    finally:
        await drop_socket()


async def _agent_ticks(send, agent: dict, stats: dict, rng: random.Random, period: float) -> None:
    stream = f"bench-{rng.getrandbits(48):x}"
    util = [rng.uniform(0, 100) for _ in agent["uuids"]]
    seq = 0
    pending: list[dict] = []  # as the agent's TelemetryBuffer: unsent batches, oldest first
    await asyncio.sleep(rng.random() * period)  # spread the hosts over the period
    next_at = time.monotonic()
    while time.time() < stats["stop"]:
        seq += 1
        gpus = []
        for k, uuid in enumerate(agent["uuids"]):
            util[k] = min(100.0, max(0.0, util[k] + rng.gauss(0, 8)))
            u = round(util[k])
            gpus.append({"uuid": uuid, "utilization_gpu_pct": u, "utilization_memory_pct": u // 2,
                         "memory_used_mib": 800 * u, "memory_total_mib": 81559, "temperature_c": 35 + u // 2,
                         "power_w": 100.0 + 6 * u, "processes": [{"pid": 1000 + k, "used_memory_mib": 800 * u}]})
        t = time.time()
        pending.append({"seq": seq, "t": t, "gpus": gpus})
        if len(pending) > BUFFER_BATCHES:
            del pending[0]
            if stats["measuring"]:
                stats["buffer_dropped"] = stats.get("buffer_dropped", 0) + 1
        chunk = pending[:BATCHES_PER_REQUEST]
        body = {"stream": stream, "batches": chunk}
        try:
            # orjson: the load generator shares the machine with the portal, so it should cost little.
            status, answer = await send(body)
            elapsed = (time.time() - t) * 1000
            if status == 200:
                del pending[:len(chunk)]
                if stats["measuring"]:
                    stats["accepted"] += answer["accepted"]
                    stats["ingest_ms"].append(elapsed)
            else:
                del pending[:len(chunk)]  # refused as it is: the agent drops it rather than retry forever
                stats["http_errors"][status] = stats["http_errors"].get(status, 0) + 1
        except SocketBusy:
            if stats["measuring"]:
                stats["held_while_busy"] = stats.get("held_while_busy", 0) + 1
        except Exception as error:  # noqa: BLE001 - count and go on, as an agent would (its batches stay buffered)
            stats["errors"][type(error).__name__] = stats["errors"].get(type(error).__name__, 0) + 1
        # As `python -m agent` does (agent/telemetry.py: TelemetrySender.run): the next sample is
        # taken on the next whole tick after the request returned; ticks missed while a request was
        # in flight are skipped, not sent back to back, and counted.
        next_at += period
        late = time.monotonic() - next_at
        if late > 0:
            missed = int(late / period) + 1
            next_at += missed * period
            if stats["measuring"]:
                stats["ticks_skipped"] += missed
        await asyncio.sleep(max(0.0, next_at - time.monotonic()))


async def _client(session, base: str, pool: str, token: str, stats: dict) -> None:
    """One dashboard: a WebSocket on a pool; records each telemetry message's age on arrival.
    Runs until cancelled (no timer per message: the load generator shares the machine)."""
    url = base.replace("http", "ws", 1) + f"/ws/pools/{pool}/"
    try:
        async with session.ws_connect(url, headers={"Authorization": f"Token {token}"}, heartbeat=None,
                                      max_msg_size=0) as ws:
            stats["connected"] += 1
            async for msg in ws:
                now = time.time()
                if msg.type != 1:  # TEXT
                    break
                head = msg.data[:80]
                if not head.startswith('{"type":"telemetry.samples"'):
                    continue
                t = float(head.split('"t":', 1)[1].split(",", 1)[0])
                if stats["measuring"]:
                    stats["latency_ms"].append((now - t) * 1000)
                    stats["arrived_at"].append(now)
                    stats["messages"] += 1
    except asyncio.CancelledError:
        raise
    except Exception as error:  # noqa: BLE001
        stats["errors"][f"ws:{type(error).__name__}"] = stats["errors"].get(f"ws:{type(error).__name__}", 0) + 1


async def _baseline(fleet: dict, per_message: int, seconds: float, env: dict, stats: dict) -> None:
    """Run publish_baseline in its own process (as the ingest runs in the web server's) and keep what the
    clients measured during its last `seconds` - 2 as the baseline."""
    publisher = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "benchmarks.telemetry", "--publish-baseline", ",".join(fleet["pool_groups"]),
        "--gpus-per-agent", str(per_message), "--seconds", str(seconds), cwd=ROOT, env=env)
    await asyncio.sleep(2)  # the publisher starts Django
    stats["measuring"] = True
    await publisher.wait()
    stats["measuring"] = False
    stats["baseline_latency_ms"], stats["latency_ms"], stats["arrived_at"] = stats["latency_ms"], [], []
    stats["messages"] = 0


async def _run_load(http_base: str, ws_base: str, fleet: dict, clients: int, seconds: float, warmup: float,
                    server_pids: dict[str, int], baseline: tuple[int, float, dict] | None = None) -> dict:
    import aiohttp

    stats = {"accepted": 0, "ticks_skipped": 0, "ingest_ms": [], "latency_ms": [], "arrived_at": [], "messages": 0, "connected": 0,
             "errors": {}, "http_errors": {}, "measuring": False, "stop": float("inf")}
    connector = aiohttp.TCPConnector(limit=0)
    timeout = aiohttp.ClientTimeout(total=None, sock_connect=30)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        pools = fleet["pools"]
        watchers = [asyncio.create_task(_client(session, ws_base, pools[i % len(pools)], fleet["token"], stats))
                    for i in range(clients)]
        connecting = time.time()
        while stats["connected"] < clients and time.time() < connecting + 300:
            await asyncio.sleep(0.2)
        stats["connect_s"] = time.time() - connecting
        if baseline is not None:
            await _baseline(fleet, *baseline, stats)
        stats["stop"] = time.time() + warmup + seconds + 2
        agents = [asyncio.create_task(agent_loop(session, http_base, a, stats, random.Random(i)))
                  for i, a in enumerate(fleet["agents"])]
        await asyncio.sleep(warmup)
        stats["measuring"] = True
        started, own0 = time.time(), time.process_time()
        stats["started"] = started
        cpu0 = {name: _cpu_seconds([pid]) for name, pid in server_pids.items()}
        await asyncio.sleep(seconds)
        stats["measuring"] = False
        measured = time.time() - started
        stats["server_cpu_by"] = {name: _cpu_seconds([pid]) - cpu0[name] for name, pid in server_pids.items()}
        stats["server_cpu_s"] = sum(stats["server_cpu_by"].values())
        stats["load_generator_cpu_s"] = time.process_time() - own0
        stats["loadavg"] = os.getloadavg()
        await asyncio.gather(*agents, return_exceptions=True)
        for watcher in watchers:
            watcher.cancel()
        await asyncio.gather(*watchers, return_exceptions=True)
    stats["measured_s"] = measured
    return stats


def _p95_by_second(stats: dict) -> list[float | None]:
    """p95 of the messages that arrived in each second of the measured window: a slow second
    (a vacuum, a checkpoint, another process waking) shows up here, not in the run's p95 alone."""
    by_second: dict[int, list[float]] = {}
    for at, latency in zip(stats["arrived_at"], stats["latency_ms"]):
        by_second.setdefault(int(at - stats["started"]), []).append(latency)
    return [_percentile(by_second.get(s, []), 95) for s in range(int(stats["measured_s"]))]


# --- the server ----------------------------------------------------------------------------

def _event_loop_runner():
    try:
        import uvloop
    except ImportError:
        return asyncio.run
    return uvloop.run


def _env(mode: str, var_dir: str) -> dict:
    env = dict(os.environ, PORTAL_VAR_DIR=var_dir, PYTHONUNBUFFERED="1", LOG_LEVEL="WARNING",
               TELEMETRY_MAX_SAMPLES_PER_AGENT_MINUTE="1000000")
    if mode == "embedded":
        env.pop("REDIS_URL", None)
        env.pop("DATABASE_URL", None)
    else:
        for name in ("DATABASE_URL", "REDIS_URL", "SECRET_KEY"):
            if not env.get(name):
                sys.exit(f"redis mode needs {name} (see `make benchmark-telemetry`)")
    return env


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.telemetry", description=__doc__.split("\n\n")[0])
    parser.add_argument("--gpus", type=int, default=1000)
    parser.add_argument("--clients", type=int, default=100)
    parser.add_argument("--seconds", type=float, default=30)
    parser.add_argument("--json", metavar="FILE")
    parser.add_argument("--mode", choices=["redis", "embedded"],
                        default="redis" if os.environ.get("REDIS_URL") else "embedded")
    parser.add_argument("--gpus-per-agent", type=int, default=100)
    parser.add_argument("--pools", type=int, default=0, help="pools to spread the GPUs over (default: one per agent)")
    parser.add_argument("--workers", type=int, default=0,
                        help="uvicorn processes (default: redis 2, embedded 1)")
    parser.add_argument("--web-workers", type=int, default=0,
                        help="web server processes in redis mode (default: config.web's, WEB_WORKERS or cores + 1)")
    parser.add_argument("--web-threads", type=int, default=0,
                        help="threads per web server process (default: config.web's, WEB_THREADS or 2)")
    parser.add_argument("--warmup", type=float, default=5)
    parser.add_argument("--baseline-seconds", type=float, default=12,
                        help="redis mode: first time a bare Channels fan-out to the same clients (0: skip)")
    parser.add_argument("--prepare", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--publish-baseline", metavar="GROUPS", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    agents = (args.gpus + args.gpus_per_agent - 1) // args.gpus_per_agent
    pools = args.pools or agents

    if args.publish_baseline:  # child: the baseline's publisher
        publish_baseline(args.publish_baseline.split(","), args.gpus_per_agent, args.seconds)
        return 0
    if args.prepare:  # child: build the fleet in this environment's database
        print(json.dumps(prepare(args.gpus, args.gpus_per_agent, pools)))
        return 0

    var_dir = tempfile.mkdtemp(prefix="bench-telemetry-")
    env = _env(args.mode, var_dir)
    if args.mode == "redis":
        import redis

        redis.Redis.from_url(env["REDIS_URL"]).flushdb()
    setup = subprocess.run([sys.executable, "-m", "benchmarks.telemetry", "--prepare", "--gpus", str(args.gpus),
                            "--gpus-per-agent", str(args.gpus_per_agent), "--pools", str(pools)],
                           env=env, cwd=ROOT, capture_output=True, text=True, check=False)
    if setup.returncode != 0:
        sys.exit("preparing the fleet failed:\n" + setup.stderr[-3000:])
    fleet = json.loads(setup.stdout.strip().splitlines()[-1])
    workers = args.workers or (2 if args.mode == "redis" else 1)
    web_workers = args.web_workers or (os.cpu_count() or 1) + 1
    servers, logs = [], []
    ws_port = _free_port()
    ws_base = f"http://127.0.0.1:{ws_port}"
    # As in production (Procfile): WebSockets from uvicorn; in redis mode the HTTP ingest from
    # the web server (python -m config.web), in embedded mode everything from one process.
    commands = [("uvicorn", ws_port, [sys.executable, "-m", "uvicorn", "config.asgi:application", "--host",
                                      "127.0.0.1", "--port", str(ws_port), "--workers", str(workers),
                                      "--lifespan", "off", "--log-level", "warning", "--no-access-log"])]
    http_base = ws_base
    if args.mode == "redis":
        http_port = _free_port()
        http_base = f"http://127.0.0.1:{http_port}"
        commands.append(("web", http_port, [sys.executable, "-m", "config.web", "--workers", str(web_workers),
                                            *(["--threads", str(args.web_threads)] if args.web_threads else []),
                                            "--port", str(http_port), "--log-level", "warning"]))
    for name, port, command in commands:
        log_path = Path(var_dir) / f"{name}.log"
        logs.append(log_path)
        with open(log_path, "wb") as log:
            servers.append(subprocess.Popen(command, env=env, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT))
    try:
        import urllib.request

        deadline = time.time() + 60
        for base in {ws_base, http_base}:
            while True:
                try:
                    urllib.request.urlopen(f"{base}/healthz", timeout=1).read()
                    break
                except OSError:
                    if any(s.poll() is not None for s in servers) or time.time() > deadline:
                        sys.exit("a server did not start:\n" + "".join(p.read_text()[-2000:] for p in logs))
                    time.sleep(0.3)
        print(f"{args.mode}: {args.gpus} GPUs in {agents} agents over {pools} pools, {args.clients} WebSocket "
              f"clients, {workers} uvicorn{f' + {web_workers} web' if args.mode == 'redis' else ''} worker(s); {args.warmup:g} s warm-up, "
              f"{args.seconds:g} s measured",
              flush=True)
        # uvloop (uvicorn[standard] installs it) when there: the load generator shares the cores
        # with the portal, and on asyncio's own loop it used 0.30-0.33 of a core, on uvloop 0.23-0.25.
        # The baseline needs a publisher outside the servers, so the in-memory layer (embedded) has none.
        baseline = ((args.gpus_per_agent, args.baseline_seconds, env)
                    if args.mode == "redis" and args.baseline_seconds > 0 else None)
        stats = _event_loop_runner()(_run_load(http_base, ws_base, fleet, args.clients, args.seconds, args.warmup,
                                      {c[0]: s.pid for c, s in zip(commands, servers)}, baseline))
    finally:
        for server in servers:
            server.terminate()
        for server in servers:
            try:
                server.wait(timeout=20)
            except subprocess.TimeoutExpired:
                server.kill()

    result = {
        "mode": args.mode,
        "gpus": args.gpus,
        "clients": args.clients,
        "seconds": args.seconds,
        "agents": agents,
        "gpus_per_agent": args.gpus_per_agent,
        "pools": pools,
        "servers": {"uvicorn": workers, **({"web": web_workers} if args.mode == "redis" else {})},
        "target_samples_per_s": args.gpus,
        "samples_per_s": round(stats["accepted"] / stats["measured_s"], 1),
        "latency_ms_p50": _percentile(stats["latency_ms"], 50),
        "latency_ms_p95": _percentile(stats["latency_ms"], 95),
        "latency_ms_p99": _percentile(stats["latency_ms"], 99),
        "latency_ms_max": round(max(stats["latency_ms"]), 1) if stats["latency_ms"] else None,
        "ingest_ms_p50": _percentile(stats["ingest_ms"], 50),
        "ingest_ms_p95": _percentile(stats["ingest_ms"], 95),
        "ingest_ms_p99": _percentile(stats["ingest_ms"], 99),
        # Seconds an agent did not sample because its previous request was still in flight.
        "agent_ticks_skipped": stats["ticks_skipped"],
        "clients_connected": stats["connected"],
        "clients_connect_s": round(stats["connect_s"], 1),
        "messages_received": stats["messages"],
        "messages_expected": round(args.clients * stats["measured_s"] * agents / pools),
        "http_errors": stats["http_errors"],
        "errors": stats["errors"],
        "cpu_count": os.cpu_count(),
        # How busy the portal's processes were (cores), and the load generator beside them.
        "server_cores_used": round(stats["server_cpu_s"] / stats["measured_s"], 2),
        "server_cores_by_process": {k: round(v / stats["measured_s"], 2) for k, v in stats["server_cpu_by"].items()},
        "load_generator_cores_used": round(stats["load_generator_cpu_s"] / stats["measured_s"], 2),
        "server_cpu_ms_per_1000_samples": round(1000 * stats["server_cpu_s"] / max(1, stats["accepted"]) * 1000, 1),
        "machine_loadavg_1m_at_end": round(stats["loadavg"][0], 2),
    }
    if stats["latency_ms"]:
        result["latency_ms_mean"] = round(statistics.fmean(stats["latency_ms"]), 1)
    if stats.get("baseline_latency_ms"):
        # The same clients, fed by a bare fan-out at the same rate and size with nothing else running:
        # the ratio says how much of the latency the ingest adds, on this machine at this moment.
        result["baseline_fanout_messages"] = len(stats["baseline_latency_ms"])
        result["baseline_fanout_latency_ms_p50"] = _percentile(stats["baseline_latency_ms"], 50)
        result["baseline_fanout_latency_ms_p95"] = _percentile(stats["baseline_latency_ms"], 95)
        if stats["latency_ms"] and result["baseline_fanout_latency_ms_p95"]:
            result["latency_p95_vs_baseline_fanout"] = round(
                result["latency_ms_p95"] / result["baseline_fanout_latency_ms_p95"], 2)
        result["latency_ms_p95_by_second"] = _p95_by_second(stats)
    print(json.dumps(result, indent=2))
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
    tail = [line for log_path in logs for line in log_path.read_text(errors="replace").splitlines()
            if "Traceback" in line or "Error" in line][-5:]
    if tail:
        print("server log (last errors):\n  " + "\n  ".join(tail), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
