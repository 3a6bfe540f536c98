"""Fleet scale benchmark: `python -m benchmarks.fleet --gpus 10000 --teams 1000 --json FILE`.

Builds two portals in their own databases and runs the same load on each, one after the other:

- the EMPTY portal (the baseline): one pool of 8 GPUs on one host, one team, one user;
- the FLEET: --gpus GPUs on --gpus/8 bare-metal hosts in up to five pools by GPU model (with weights),
  --teams teams with quotas on two pools each, --users users (each a member of some teams and manager
  of others, each with an API token and a signed-in session) and a year of ended reservations
  (--history-per-team per team, with their GPU grants and state events). Inserted with bulk_create.

For each, it drops and recreates the database (DATABASE_URL, and --empty-database-url), migrates, builds,
empties the portal's Redis database, and starts the processes as the Procfile runs them: the web server
(`python -m config.web`, --web-workers processes), the WebSocket server (uvicorn config.asgi, --ws-workers),
one Celery worker (threads) and Celery beat. Then, after --warmup seconds, it measures for --seconds:

- every host's agent: telemetry at 1 Hz (POST /api/v1/agent/telemetry/ with its host token, the body of
  `python -m agent`, sent as benchmarks.telemetry's agents send it) and its lease channel open
  (/ws/agent/, answering each `leases` message with `held` as agent/lease_channel.py does), all from one
  async load process;
- --users users in a closed loop with think time (exponential, mean --think seconds) from a second load
  process: the pages (/, /reserve/, /reservations/, a reservation of their teams, their team's page,
  a pool page) with their session cookie, and the API with their token (reservations list, pools list,
  a pool's availability, create a reservation an hour long up to a month ahead, release it, /me/), plus
  --watchers pool and node WebSockets (live dashboards);

and reports p50/p95/p99 of every call on both portals with the ratio fleet/empty of the p95, whether each
met the issue's target (page p95 < 500 ms, API p95 < 250 ms), the telemetry offered and achieved
samples/s, the samples refused or late, and each portal process's CPU seconds in the measured window
and peak RSS (VmHWM of its process tree, from /proc). Everything shares the machine's cores: the load
processes, PostgreSQL and Redis included (their CPU is in the machine's busy fraction, also reported).
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from datetime import timedelta
from decimal import Decimal
from pathlib import Path
from urllib.parse import urlsplit

from benchmarks.common import cpu_seconds, free_port, peak_rss_mib, percentile, summarize_calls, wait_http

ROOT = Path(__file__).resolve().parent.parent
GPUS_PER_HOST = 8
# Pools by GPU model: slug, model name, weight (GE per GPU), memory MiB, share of the fleet's hosts.
POOLS = [("h100", "NVIDIA H100 80GB HBM3", "1.000", 81559, 0.40),
         ("a100", "NVIDIA A100-SXM4-80GB", "0.600", 81920, 0.25),
         ("l40s", "NVIDIA L40S", "0.450", 46068, 0.15),
         ("h200", "NVIDIA H200", "1.300", 143771, 0.12),
         ("a10", "NVIDIA A10", "0.200", 23028, 0.08)]
PAGES = ["page /", "page /reserve/", "page /reservations/", "page reservation", "page team", "page pool"]
APIS = ["api GET reservations", "api GET pools", "api GET availability", "api POST create", "api POST release",
        "api GET me"]
TELEMETRY = "agent POST telemetry"
TARGET_MS = {"page": 500.0, "api": 250.0, "agent": 250.0}


# --- building a portal (runs in a child process with that portal's environment) -----------------------

def build(gpus: int, teams: int, users: int, history_per_team: int, seed: int) -> dict:
    """Migrate this (fresh) database and fill it; returns what the load needs and the row counts."""
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
    import django

    django.setup()
    from django.conf import settings
    from django.contrib.auth import get_user_model
    from django.core.management import call_command
    from django.db import connection, transaction
    from django.test import Client
    from django.utils import timezone

    from allocations.models import Allocation, Quota, Reservation, ReservationEvent
    from common.secrets import key_digest, new_key
    from inventory.models import Cluster, Gpu, GpuModel, GpuPool, HostToken, Node
    from teams.models import Membership, Team
    from teams.services import api_token_create

    timings = {}
    started = time.perf_counter()
    call_command("migrate", verbosity=0)
    timings["migrate_s"] = round(time.perf_counter() - started, 1)
    rng = random.Random(seed)
    now = timezone.now()
    User = get_user_model()
    # Rows inserted in bulk keep the timestamps given them (history has its own past ones).
    for model, name in ((Reservation, "created_at"), (Reservation, "updated_at"), (ReservationEvent, "at")):
        field = model._meta.get_field(name)
        field.auto_now_add = field.auto_now = False

    started = time.perf_counter()
    hosts = max(1, gpus // GPUS_PER_HOST)
    with transaction.atomic():
        staff = User.objects.create(username="fleet-staff", is_staff=True, is_superuser=True)
        cluster = Cluster.objects.create(name="Fleet", slug="fleet", kind=Cluster.Kind.BAREMETAL)
        pool_specs = POOLS[:min(len(POOLS), hosts)]
        pools = []
        for slug, model, weight, _, _ in pool_specs:
            GpuModel.objects.update_or_create(name=model, defaults={"weight": Decimal(weight)})
            pools.append(GpuPool.objects.create(slug=slug, name=model, sharing_mode="exclusive"))
        # Hosts per pool by the pools' shares; every pool at least one host.
        counts = [max(1, round(hosts * spec[4])) for spec in pool_specs]
        counts[0] += hosts - sum(counts)
        host_pool = [p for p, n in enumerate(counts) for _ in range(n)]
        nodes = Node.objects.bulk_create(
            [Node(cluster=cluster, name=f"gpu-{i:05d}", last_seen_at=now, cpu_milli=128000, memory_mib=2097152,
                  labels={"pool": pools[host_pool[i]].slug}) for i in range(hosts)], batch_size=2000)
        gpu_rows = Gpu.objects.bulk_create(
            [Gpu(node=node, pool=pools[host_pool[i]], index=k, uuid=f"GPU-fleet-{i:05d}-{k}",
                 model_name=pool_specs[host_pool[i]][1], memory_mib=pool_specs[host_pool[i]][3],
                 driver_version="550.54.15", cuda_version="12.4")
             for i, node in enumerate(nodes) for k in range(GPUS_PER_HOST)], batch_size=5000)
        keys = [new_key() for _ in nodes]
        HostToken.objects.bulk_create(
            [HostToken(cluster=cluster, host_name=node.name, key_hash=key_digest(key), prefix=key[:8],
                       created_by=staff) for node, key in zip(nodes, keys)], batch_size=2000)
        timings["fleet_s"] = round(time.perf_counter() - started, 1)

        started = time.perf_counter()
        team_rows = Team.objects.bulk_create([Team(slug=f"team-{t:04d}", name=f"Team {t}") for t in range(teams)])
        weights = [spec[4] for spec in pool_specs]
        team_pools = []
        quotas = []
        for team in team_rows:
            first = rng.choices(range(len(pools)), weights)[0]
            mine = [first] if len(pools) == 1 else [first, rng.choice([p for p in range(len(pools)) if p != first])]
            team_pools.append(mine)
            quotas += [Quota(team=team, pool=pools[p], max_ge=Decimal(rng.choice((8, 16, 32, 64))),
                             ge_hours_per_month=None) for p in mine]
        Quota.objects.bulk_create(quotas, batch_size=5000)
        user_rows = User.objects.bulk_create(
            [User(username=f"user-{u:03d}", email=f"user-{u:03d}@example.com", password="!") for u in range(users)])
        # Team t: user t % users a member, user (t + users // 2) % users its manager.
        memberships = {}
        for t, team in enumerate(team_rows):
            memberships[(t % users, t)] = Membership.Role.MEMBER
            memberships[((t + users // 2) % users, t)] = Membership.Role.MANAGER
        Membership.objects.bulk_create([Membership(user=user_rows[u], team=team_rows[t], role=role)
                                        for (u, t), role in memberships.items()], batch_size=5000)
        timings["teams_users_s"] = round(time.perf_counter() - started, 1)

        # A year of ended reservations. Each goes on the host of its pool that is free soonest (whole hosts'
        # first GPUs), so no two grants of one GPU overlap, as the booking engine would have made them.
        started = time.perf_counter()
        pool_hosts = {p: [i for i in range(hosts) if host_pool[i] == p] for p in range(len(pools))}
        free_at = {i: now - timedelta(days=365) for i in range(hosts)}
        host_gpus = [gpu_rows[i * GPUS_PER_HOST:(i + 1) * GPUS_PER_HOST] for i in range(hosts)]
        members_of = {t: [u for (u, tt) in memberships if tt == t] for t in range(teams)}
        wanted = []
        for t in range(teams):
            for _ in range(history_per_team):
                start = now - timedelta(days=365) + timedelta(seconds=rng.uniform(0, 360 * 86400))
                wanted.append((start, t, rng.choice(team_pools[t])))
        wanted.sort()
        reservations, grants, event_specs = [], [], []
        for start, t, p in wanted:
            host = min(rng.sample(pool_hosts[p], min(4, len(pool_hosts[p]))), key=free_at.__getitem__)
            start = max(start, free_at[host])
            hours = rng.choice((1, 2, 4, 8, 12, 24, 48, 72))
            ends = start + timedelta(hours=hours)
            state = rng.choices((Reservation.State.RELEASED, Reservation.State.EXPIRED, Reservation.State.FAILED),
                                (70, 25, 5))[0]
            ended = start + (ends - start) * rng.uniform(0.3, 1.0) if state == Reservation.State.RELEASED else ends
            if ended > now - timedelta(minutes=10):
                continue
            n = rng.choice((1, 1, 1, 2, 2, 4, 8))
            weight = float(pool_specs[p][2])
            created = start - timedelta(minutes=rng.uniform(1, 600))
            user = user_rows[rng.choice(members_of[t])]
            reservations.append(Reservation(team=team_rows[t], pool=pools[p], requested_by=user, gpus=n,
                                            ge=n * weight, starts_at=start, ends_at=ends, state=state,
                                            ended_at=ended, created_at=created, updated_at=ended))
            if state != Reservation.State.FAILED:
                free_at[host] = ended
                grants.append([(gpu, weight) for gpu in host_gpus[host][:n]])
                event_specs.append([("", "scheduled", created), ("scheduled", "applying", start),
                                    ("applying", "active", start + timedelta(seconds=20)),
                                    ("active", state, ended)])
            else:
                grants.append([])
                event_specs.append([("", "scheduled", created), ("scheduled", "applying", start),
                                    ("applying", "failed", start + timedelta(minutes=5))])
        Reservation.objects.bulk_create(reservations, batch_size=5000)
        Allocation.objects.bulk_create(
            [Allocation(reservation=r, gpu=gpu, starts_at=r.starts_at, ends_at=r.ended_at, ge=weight)
             for r, held in zip(reservations, grants) for gpu, weight in held], batch_size=5000)
        ReservationEvent.objects.bulk_create(
            [ReservationEvent(reservation=r, from_state=a, to_state=b, actor=r.requested_by, at=at)
             for r, events in zip(reservations, event_specs) for a, b, at in events], batch_size=5000)
        timings["history_s"] = round(time.perf_counter() - started, 1)

    started = time.perf_counter()
    people = []
    recent_of_team: dict[int, list[int]] = {}
    for r in reservations[::-1]:
        recent_of_team.setdefault(r.team_id, [])
        if len(recent_of_team[r.team_id]) < 3:
            recent_of_team[r.team_id].append(r.pk)
    for u, user in enumerate(user_rows):
        _, key = api_token_create(user=user, name="benchmark")
        client = Client()
        client.force_login(user, backend="teams.backends.LocalAccountsBackend")
        mine = sorted(t for (uu, t) in memberships if uu == u)
        people.append({
            "username": user.username, "token": key, "session": client.cookies[settings.SESSION_COOKIE_NAME].value,
            "teams": [{"slug": team_rows[t].slug, "pools": [pools[p].slug for p in team_pools[t]]} for t in mine],
            "reservations": [pk for t in mine for pk in recent_of_team.get(team_rows[t].pk, [])][:6],
        })
    timings["tokens_sessions_s"] = round(time.perf_counter() - started, 1)
    started = time.perf_counter()
    with connection.cursor() as cursor:
        cursor.execute("VACUUM ANALYZE")
    timings["vacuum_analyze_s"] = round(time.perf_counter() - started, 1)
    rows = {"hosts": hosts, "gpus": len(gpu_rows), "pools": len(pools), "teams": teams, "quotas": len(quotas),
            "users": users, "memberships": len(memberships), "reservations": len(reservations),
            "allocations": Allocation.objects.count(), "reservation_events": ReservationEvent.objects.count()}
    return {
        "rows": rows, "timings": timings,
        "hosts": [{"key": key, "node": node.pk, "pool": pools[host_pool[i]].slug, "uuids": [g.uuid for g in host_gpus[i]]}
                  for i, (node, key) in enumerate(zip(nodes, keys))],
        "pools": [p.slug for p in pools], "users": people, "session_cookie": settings.SESSION_COOKIE_NAME,
    }


# --- the load (each runs in its own process) ---------------------------------------------------------

class Window:
    """The measured window, in epoch seconds, shared by the orchestrator and the load processes."""

    def __init__(self, start: float, warmup: float, seconds: float) -> None:
        self.begin = start + warmup
        self.end = self.begin + seconds

    def measuring(self, at: float | None = None) -> bool:
        at = time.time() if at is None else at
        return self.begin <= at < self.end


async def _lease_channel(session, ws_base: str, host: dict, stats: dict, window: Window) -> None:
    """One agent's lease channel: open until the run ends, answering `leases` with `held` (agent/lease_channel.py)."""
    await asyncio.sleep(random.uniform(0, max(0.0, window.begin - time.time()) * 0.6))
    try:
        async with session.ws_connect(f"{ws_base}/ws/agent/", headers={"Authorization": f"Host {host['key']}"},
                                      heartbeat=None) as ws:
            stats["lease_connected"] += 1
            host["lease_channel_open"] = True  # the telemetry socket's sign that WebSockets pass (agent_loop)
            async for msg in ws:
                if msg.type != 1:  # TEXT
                    break
                message = json.loads(msg.data)
                if message.get("type") == "leases":
                    stats["lease_messages"] += 1
                    held = [lease["key"] for lease in message.get("leases", []) if isinstance(lease, dict)
                            and lease.get("key")]
                    await ws.send_str(json.dumps({"type": "held", "held": held, "failed": {},
                                                  "unleased_in_use": []}))
            host["lease_channel_open"] = False
            if time.time() < window.end:
                stats["lease_closed_early"] += 1
    except asyncio.CancelledError:
        raise
    except Exception as error:  # noqa: BLE001 - count and go on
        stats["errors"][f"lease:{type(error).__name__}"] = stats["errors"].get(f"lease:{type(error).__name__}", 0) + 1


async def _heartbeats(session, http_base: str, host: dict, stats: dict, every: float, rng: random.Random) -> None:
    """A host's main loop over HTTP, as `python -m agent` runs it (agent/__main__.py: Agent.run): every
    AGENT_HEARTBEAT_SECONDS (`every`, 10) a heartbeat, except that while its telemetry frames are answered on
    the socket (`host["telemetry_socket_open"]`, kept by benchmarks.telemetry.agent_loop) only every
    HEARTBEATS_WHILE_STREAMING-th is sent; and while its lease channel is not open, a lease poll
    (/api/v1/agent/leases/) each time as well. Without heartbeats the portal takes the hosts for silent after
    HOST_SILENCE_TIMEOUT_SECONDS and fails their GPUs over (what refused the first runs' creates
    `insufficient_capacity`)."""
    from agent.__main__ import HEARTBEATS_WHILE_STREAMING

    headers = {"Authorization": f"Host {host['key']}", "Content-Type": "application/json"}
    quiet_beats = 0

    async def post(path: str, body: bytes, name: str) -> None:
        try:
            async with session.post(f"{http_base}{path}", data=body, headers=headers) as response:
                await response.read()
                if response.status != 200:
                    stats["heartbeat_errors"][response.status] = stats["heartbeat_errors"].get(response.status, 0) + 1
                elif stats["measuring"]:
                    stats[name] = stats.get(name, 0) + 1
        except Exception as error:  # noqa: BLE001 - count and go on, as an agent would
            stats["errors"][f"{name}:{type(error).__name__}"] = stats["errors"].get(
                f"{name}:{type(error).__name__}", 0) + 1

    await asyncio.sleep(rng.random() * every)
    while time.time() < stats["stop"]:
        if host.get("telemetry_socket_open") and quiet_beats < HEARTBEATS_WHILE_STREAMING - 1:
            quiet_beats += 1
        else:
            quiet_beats = 0
            await post("/api/v1/agent/heartbeat/", b"{}", "heartbeats")
        if not host.get("lease_channel_open"):
            await post("/api/v1/agent/leases/", b'{"held": [], "failed": {}, "unleased_in_use": []}', "lease_polls")
        await asyncio.sleep(every)


async def run_agents(http_base: str, ws_base: str, hosts: list[dict], window: Window, period: float = 1.0,
                     over: str = "websocket") -> dict:
    import aiohttp

    from benchmarks.telemetry import agent_loop

    stats = {"accepted": 0, "ticks_skipped": 0, "ingest_ms": [], "http_errors": {}, "errors": {},
             "measuring": False, "stop": window.end, "lease_connected": 0, "lease_messages": 0,
             "lease_closed_early": 0, "heartbeats": 0, "heartbeat_errors": {}}
    connector = aiohttp.TCPConnector(limit=0)
    timeout = aiohttp.ClientTimeout(total=None, sock_connect=30)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout,
                                     cookie_jar=aiohttp.DummyCookieJar()) as session:
        leases = [asyncio.create_task(_lease_channel(session, ws_base, h, stats, window)) for h in hosts]
        socket_base = ws_base if over == "websocket" else None
        beats = [asyncio.create_task(_heartbeats(session, http_base, h, stats, 10.0, random.Random(-i)))
                 for i, h in enumerate(hosts)]
        agents = [asyncio.create_task(agent_loop(session, http_base, h, stats, random.Random(i), period, socket_base))
                  for i, h in enumerate(hosts)]
        await asyncio.sleep(max(0.0, window.begin - time.time()))
        stats["measuring"] = True
        cpu0 = time.process_time()
        stats["lease_connected_at_start"] = stats["lease_connected"]
        await asyncio.sleep(max(0.0, window.end - time.time()))
        stats["measuring"] = False
        stats["cpu_s"] = time.process_time() - cpu0
        await asyncio.gather(*agents, return_exceptions=True)
        for task in [*leases, *beats]:
            task.cancel()
        await asyncio.gather(*leases, *beats, return_exceptions=True)
    return stats


async def _watcher(session, ws_base: str, path: str, token: str, stats: dict) -> None:
    try:
        async with session.ws_connect(f"{ws_base}{path}", headers={"Authorization": f"Token {token}"},
                                      heartbeat=None, max_msg_size=0) as ws:
            stats["watchers_connected"] += 1
            async for msg in ws:
                if msg.type != 1:
                    break
                if stats["measuring"]:
                    stats["watcher_messages"] += 1
    except asyncio.CancelledError:
        raise
    except Exception as error:  # noqa: BLE001
        stats["errors"][f"ws:{type(error).__name__}"] = stats["errors"].get(f"ws:{type(error).__name__}", 0) + 1


def _rule(body: bytes) -> str:
    try:
        return json.loads(body)["errors"][0]["rule"]
    except (ValueError, KeyError, IndexError, TypeError):
        return "?"


async def run_users(http_base: str, ws_base: str, fleet: dict, users: int, think: float, watchers: int,
                    window: Window, seed: int) -> dict:
    import aiohttp

    latencies: dict[str, list[float]] = {name: [] for name in PAGES + APIS}
    statuses: dict[str, dict[str, int]] = {name: {} for name in PAGES + APIS}
    stats = {"measuring": False, "watchers_connected": 0, "watcher_messages": 0, "errors": {}, "actions": 0}
    people = fleet["users"]
    rng = random.Random(seed)

    async def call(session, name: str, method: str, url: str, **kwargs):
        started_at = time.time()
        started = time.perf_counter()
        try:
            async with session.request(method, url, allow_redirects=False, **kwargs) as response:
                body = await response.read()
                status = response.status
        except asyncio.CancelledError:
            raise
        except Exception as error:  # noqa: BLE001 - a timeout or a reset is a failed call, recorded as 599
            stats["errors"][f"{name}:{type(error).__name__}"] = stats["errors"].get(
                f"{name}:{type(error).__name__}", 0) + 1
            body, status = b"", 599
        if window.measuring(started_at):
            latencies[name].append((time.perf_counter() - started) * 1000)
            # A refusal is counted with its rule (common.errors' body), so a 409 says why: over quota, no room...
            key = str(status) if status < 400 else f"{status} {_rule(body)}"
            statuses[name][key] = statuses[name].get(key, 0) + 1
        return status, body

    async def user_loop(index: int) -> None:
        person = people[index % len(people)]
        r = random.Random(seed * 1000 + index)
        cookie = {"Cookie": f"{fleet['session_cookie']}={person['session']}"}
        token = {"Authorization": f"Token {person['token']}"}
        held: list[int] = []
        booked: list[int] = []
        await asyncio.sleep(r.uniform(0, max(0.1, min(think, window.begin - time.time()))))
        while time.time() < window.end:
            team = r.choice(person["teams"])
            pool = r.choice(team["pools"])
            choice = "api POST release" if held else r.choice(PAGES + APIS[:-2] + APIS[-1:])
            if choice == "page /":
                await call(session, choice, "GET", f"{http_base}/", headers=cookie)
            elif choice == "page /reserve/":
                await call(session, choice, "GET", f"{http_base}/reserve/", headers=cookie)
            elif choice == "page /reservations/":
                await call(session, choice, "GET", f"{http_base}/reservations/", headers=cookie)
            elif choice == "page reservation":
                # One of its teams' (the history's, or one this client booked: the empty portal has no history).
                mine = person["reservations"] + booked[-3:]
                if mine:
                    await call(session, choice, "GET", f"{http_base}/reservations/{r.choice(mine)}/", headers=cookie)
                else:
                    await call(session, "page /reservations/", "GET", f"{http_base}/reservations/", headers=cookie)
            elif choice == "page team":
                await call(session, choice, "GET", f"{http_base}/teams/{team['slug']}/", headers=cookie)
            elif choice == "page pool":
                await call(session, choice, "GET", f"{http_base}/pools/{pool}/", headers=cookie)
            elif choice == "api GET reservations":
                await call(session, choice, "GET", f"{http_base}/api/v1/reservations/?limit=20", headers=token)
            elif choice == "api GET pools":
                await call(session, choice, "GET", f"{http_base}/api/v1/pools/", headers=token)
            elif choice == "api GET availability":
                await call(session, choice, "GET", f"{http_base}/api/v1/pools/{pool}/availability/?gpus=1",
                           headers=token)
            elif choice == "api GET me":
                await call(session, choice, "GET", f"{http_base}/api/v1/me/", headers=token)
            elif choice == "api POST create":
                start = time.time() + r.uniform(3600, 30 * 86400)
                body = {"pool": pool, "team": team["slug"], "gpus": 1,
                        "starts_at": _iso(start), "ends_at": _iso(start + 3600)}
                status, payload = await call(session, choice, "POST", f"{http_base}/api/v1/reservations/",
                                             json=body, headers=token)
                if status == 201:
                    held.append(json.loads(payload)["id"])
                    booked.append(held[-1])
            elif choice == "api POST release":
                await call(session, choice, "POST", f"{http_base}/api/v1/reservations/{held.pop()}/release/",
                           headers=token)
            stats["actions"] += 1
            await asyncio.sleep(r.expovariate(1 / think) if think > 0 else 0)
        for pk in held:  # leave nothing booked behind
            await call(session, "api POST release", "POST", f"{http_base}/api/v1/reservations/{pk}/release/",
                       headers=token)

    connector = aiohttp.TCPConnector(limit=0)
    timeout = aiohttp.ClientTimeout(total=60, sock_connect=30)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout,
                                     cookie_jar=aiohttp.DummyCookieJar()) as session:
        ws_session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0),
                                           timeout=aiohttp.ClientTimeout(total=None, sock_connect=30),
                                           cookie_jar=aiohttp.DummyCookieJar())
        # Live dashboards, half on a pool and half on a node, each of a pool its user holds a quota in.
        watch = []
        for i in range(watchers):
            person = people[i % len(people)]
            pool = person["teams"][0]["pools"][0]
            if i % 2 == 0:
                path = f"/ws/pools/{pool}/"
            else:
                path = f"/ws/nodes/{rng.choice([h['node'] for h in fleet['hosts'] if h['pool'] == pool])}/"
            watch.append(asyncio.create_task(_watcher(ws_session, ws_base, path, person["token"], stats)))
        loops = [asyncio.create_task(user_loop(i)) for i in range(users)]
        await asyncio.sleep(max(0.0, window.begin - time.time()))
        stats["measuring"] = True
        cpu0 = time.process_time()
        await asyncio.sleep(max(0.0, window.end - time.time()))
        stats["measuring"] = False
        stats["cpu_s"] = time.process_time() - cpu0
        await asyncio.gather(*loops, return_exceptions=True)
        for task in watch:
            task.cancel()
        await asyncio.gather(*watch, return_exceptions=True)
        await ws_session.close()
    stats["calls"] = summarize_calls(latencies, statuses, window.end - window.begin)
    return stats


def _iso(epoch: float) -> str:
    from datetime import datetime, timezone

    return datetime.fromtimestamp(epoch, timezone.utc).isoformat()


def _loop_runner():
    try:
        import uvloop
    except ImportError:
        return asyncio.run
    return uvloop.run


# --- the orchestrator ----------------------------------------------------------------------------------

def _recreate_database(url: str) -> None:
    import psycopg

    parts = urlsplit(url)
    name = parts.path.lstrip("/")
    admin = parts._replace(path="/postgres").geturl()
    with psycopg.connect(admin, autocommit=True) as connection:
        connection.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        connection.execute(f'CREATE DATABASE "{name}"')


def _unhealthy_hosts(url: str) -> int:
    import psycopg

    with psycopg.connect(url) as connection:
        return connection.execute("SELECT count(*) FROM inventory_node WHERE NOT healthy").fetchone()[0]


def _machine_busy() -> tuple[int, int]:
    """(busy, total) jiffies of all cores, from /proc/stat."""
    fields = [int(x) for x in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    idle = fields[3] + fields[4]
    return sum(fields) - idle, sum(fields)


def _portal_env(database_url: str, redis_url: str, var_dir: str, args) -> dict:
    return dict(os.environ, DATABASE_URL=database_url, REDIS_URL=redis_url, PORTAL_VAR_DIR=var_dir,
                PYTHONUNBUFFERED="1", LOG_LEVEL="WARNING", WEB_WORKERS=str(args.web_workers),
                WEB_THREADS=str(args.web_threads))


def run_portal(label: str, database_url: str, redis_url: str, sizes: dict, args) -> dict:
    """Build one portal, serve it, load it, and return what was measured."""
    import redis

    var_dir = tempfile.mkdtemp(prefix=f"bench-fleet-{label}-")
    env = _portal_env(database_url, redis_url, var_dir, args)
    print(f"[{label}] building {sizes} ...", flush=True)
    _recreate_database(database_url)
    redis.Redis.from_url(redis_url).flushdb()
    fleet_file = Path(var_dir) / "fleet.json"
    started = time.perf_counter()
    subprocess.run([sys.executable, "-m", "benchmarks.fleet", "--build", str(fleet_file),
                    "--gpus", str(sizes["gpus"]), "--teams", str(sizes["teams"]), "--users", str(sizes["users"]),
                    "--history-per-team", str(sizes["history_per_team"]), "--seed", str(args.seed)],
                   env=env, cwd=ROOT, check=True)
    setup_s = time.perf_counter() - started
    fleet = json.loads(fleet_file.read_text())
    print(f"[{label}] built in {setup_s:.1f} s: {fleet['rows']} ({fleet['timings']})", flush=True)

    web_port, ws_port = free_port(), free_port()
    http_base, ws_base = f"http://127.0.0.1:{web_port}", f"http://127.0.0.1:{ws_port}"
    commands = {
        "web": [sys.executable, "-m", "config.web", "--host", "127.0.0.1", "--port", str(web_port),
                "--log-level", "warning"],
        "ws": [sys.executable, "-m", "uvicorn", "config.asgi:application", "--host", "127.0.0.1", "--port",
               str(ws_port), "--workers", str(args.ws_workers), "--log-level", "warning", "--no-access-log"],
        "worker": [sys.executable, "-m", "celery", "-A", "config", "worker", "--loglevel", "WARNING", "--pool",
                   "threads", "--concurrency", "4", "--without-gossip", "--without-mingle"],
        "beat": [sys.executable, "-m", "celery", "-A", "config", "beat", "--loglevel", "WARNING"],
    }
    servers, logs = {}, {}
    for name, command in commands.items():
        logs[name] = Path(var_dir) / f"{name}.log"
        with open(logs[name], "wb") as log:
            servers[name] = subprocess.Popen(command, env=env, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
    loaders: dict[str, subprocess.Popen] = {}
    try:
        for base, path in ((http_base, "/readyz"), (ws_base, "/healthz")):
            if not wait_http(base + path, servers.values(), 120):
                raise SystemExit(f"[{label}] a server did not start:\n" +
                                 "".join(p.read_text(errors="replace")[-2000:] for p in logs.values()))
        start = time.time() + 2  # the load processes start Python and import aiohttp meanwhile
        window = Window(start, args.warmup, args.seconds)
        common_args = ["--http", http_base, "--ws", ws_base, "--fleet-file", str(fleet_file), "--start", str(start),
                       "--warmup", str(args.warmup), "--seconds", str(args.seconds)]
        for role, extra in (("agents", ["--telemetry-period", str(args.telemetry_period),
                                                       "--telemetry-over", args.telemetry_over]), ("users", ["--users", str(sizes["load_users"]), "--think",
                                                        str(args.think), "--watchers", str(args.watchers),
                                                        "--seed", str(args.seed)])):
            out = Path(var_dir) / f"load-{role}.json"
            loaders[role] = subprocess.Popen([sys.executable, "-m", "benchmarks.fleet", "--load", role,
                                              "--out", str(out), *common_args, *extra], env=env, cwd=ROOT)
        time.sleep(max(0.0, window.begin - time.time()))
        cpu0 = {name: cpu_seconds([p.pid]) for name, p in {**servers, **loaders}.items()}
        busy0 = _machine_busy()
        time.sleep(max(0.0, window.end - time.time()))
        cpu1 = {name: cpu_seconds([p.pid]) for name, p in {**servers, **loaders}.items()}
        busy1 = _machine_busy()
        rss = {name: peak_rss_mib([p.pid]) for name, p in {**servers, **loaders}.items()}
        for role, process in loaders.items():
            if process.wait(timeout=args.seconds + 120) != 0:
                raise SystemExit(f"[{label}] the {role} load process failed")
        queued = redis.Redis.from_url(redis_url).llen("celery")
    finally:
        for process in [*loaders.values(), *servers.values()]:
            if process.poll() is None:
                process.terminate()
        for process in [*loaders.values(), *servers.values()]:
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
    agents = json.loads((Path(var_dir) / "load-agents.json").read_text())
    users = json.loads((Path(var_dir) / "load-users.json").read_text())
    for role, stats in (("agents", agents), ("users", users)):
        rss[role] = max(rss[role], stats.get("peak_rss_mib", 0.0))
    seconds = window.end - window.begin
    hosts = len(fleet["hosts"])
    samples_offered = hosts * GPUS_PER_HOST * seconds / args.telemetry_period
    refused_requests = sum(agents["http_errors"].values())
    calls = dict(users["calls"])
    ingest = agents["ingest_ms"]
    calls[TELEMETRY] = {"requests": len(ingest), "per_s": round(len(ingest) / seconds, 1),
                        "p50_ms": round(percentile(ingest, 50), 2), "p95_ms": round(percentile(ingest, 95), 2),
                        "p99_ms": round(percentile(ingest, 99), 2),
                        "mean_ms": round(sum(ingest) / len(ingest), 2) if ingest else 0.0,
                        "statuses": {"200": len(ingest), **{str(k): v for k, v in agents["http_errors"].items()}}}
    errors = {**agents["errors"], **users["errors"]}
    server_errors = [line for path in logs.values() for line in path.read_text(errors="replace").splitlines()
                     if "Traceback" in line or "ERROR" in line][-10:]
    return {
        "rows": fleet["rows"], "setup_s": round(setup_s, 1), "setup_timings": fleet["timings"],
        "measured_s": seconds, "calls": calls,
        "telemetry": {
            "hosts": hosts, "offered_samples_per_s": round(samples_offered / seconds, 1),
            "achieved_samples_per_s": round(agents["accepted"] / seconds, 1),
            "refused_requests": refused_requests, "refused_samples": refused_requests * GPUS_PER_HOST,
            "refused_by_status": agents["http_errors"],
            "late_ticks": agents["ticks_skipped"], "late_samples": agents["ticks_skipped"] * GPUS_PER_HOST,
            # Batches an agent POSTed because its telemetry socket could not be opened (as the agent falls back).
            "sent_over_http_while_socket_down": agents.get("sent_over_http", 0),
            # Ticks whose batch stayed buffered because the socket was busy and in its backoff (sent later),
            # and batches dropped from a full buffer (lost).
            "held_while_socket_busy": agents.get("held_while_busy", 0),
            "buffer_dropped": agents.get("buffer_dropped", 0),
        },
        "lease_channels": {"hosts": hosts, "open_at_start": agents["lease_connected_at_start"],
                           "opened": agents["lease_connected"], "closed_early": agents["lease_closed_early"],
                           "leases_messages": agents["lease_messages"]},
        "heartbeats": {"answered": agents["heartbeats"], "refused": agents["heartbeat_errors"],
                       "lease_polls": agents.get("lease_polls", 0)},
        # Hosts the portal took for silent by the end (they would have failed their bookings over).
        "hosts_unhealthy_at_end": _unhealthy_hosts(database_url),
        "users": {"clients": sizes["load_users"], "think_s_mean": args.think, "actions": users["actions"],
                  "watchers": args.watchers, "watchers_connected": users["watchers_connected"],
                  "watcher_messages": users["watcher_messages"]},
        "processes": {name: {"cpu_s": round(cpu1[name] - cpu0[name], 2),
                             "cores": round((cpu1[name] - cpu0[name]) / seconds, 2), "peak_rss_mib": rss[name],
                             **({"count": args.web_workers} if name == "web" else
                                {"count": args.ws_workers} if name == "ws" else {})}
                      for name in cpu0},
        "machine_busy_fraction": round((busy1[0] - busy0[0]) / max(1, busy1[1] - busy0[1]), 3),
        "celery_queue_at_end": queued, "errors": errors, "server_log_errors": server_errors,
    }


def compare(empty: dict, fleet: dict) -> list[dict]:
    """One row per call: both portals' percentiles, the fleet/empty ratio of the p95, and the target."""
    rows = []
    for name in PAGES + APIS + [TELEMETRY]:
        f, e = fleet["calls"].get(name, {}), empty["calls"].get(name, {})
        target = TARGET_MS[name.split()[0]]
        p95 = f.get("p95_ms")
        rows.append({
            "call": name, "requests": f.get("requests", 0), "empty_requests": e.get("requests", 0),
            "p50_ms": f.get("p50_ms"), "p95_ms": p95, "p99_ms": f.get("p99_ms"),
            "empty_p50_ms": e.get("p50_ms"), "empty_p95_ms": e.get("p95_ms"), "empty_p99_ms": e.get("p99_ms"),
            "p95_vs_empty": round(p95 / e["p95_ms"], 2) if p95 and e.get("p95_ms") else None,
            "target_p95_ms": target, "met": bool(f.get("requests")) and p95 is not None and p95 < target,
            "statuses": f.get("statuses", {}),
        })
    return rows


def format_table(rows: list[dict]) -> str:
    lines = [f"{'call':<24}{'n':>6}{'p50':>9}{'p95':>9}{'p99':>9}{'empty p95':>11}{'x empty':>9}"
             f"{'target':>8}  met  statuses"]
    for row in rows:
        def ms(v):
            return "-" if v is None else f"{v:.0f}" if v >= 100 else f"{v:.1f}"
        lines.append(f"{row['call']:<24}{row['requests']:>6}{ms(row['p50_ms']):>9}{ms(row['p95_ms']):>9}"
                     f"{ms(row['p99_ms']):>9}{ms(row['empty_p95_ms']):>11}"
                     f"{'-' if row['p95_vs_empty'] is None else row['p95_vs_empty']:>9}{row['target_p95_ms']:>8.0f}"
                     f"  {'yes' if row['met'] else 'NO ':<4} {row['statuses']}")
    return "\n".join(lines)


def _default_empty_urls(database_url: str, redis_url: str) -> tuple[str, str]:
    parts = urlsplit(database_url)
    empty_db = parts._replace(path=parts.path + "_empty").geturl()
    r = urlsplit(redis_url)
    n = int(r.path.lstrip("/") or 0)
    return empty_db, r._replace(path=f"/{n - 1 if n > 0 else n + 1}").geturl()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.fleet", description=__doc__.split("\n\n")[0])
    parser.add_argument("--gpus", type=int, default=10000)
    parser.add_argument("--teams", type=int, default=1000)
    parser.add_argument("--users", type=int, default=200, help="users in the fleet, and the load's user clients")
    parser.add_argument("--history-per-team", type=int, default=50, help="ended reservations per team (a year)")
    parser.add_argument("--seconds", type=float, default=60, help="measured seconds per portal")
    parser.add_argument("--warmup", type=float, default=20)
    parser.add_argument("--think", type=float, default=10.0, help="mean think time of a user between calls (s)")
    parser.add_argument("--watchers", type=int, default=20, help="pool and node WebSockets open (dashboards)")
    parser.add_argument("--web-workers", type=int, default=2, help="web server processes (WEB_WORKERS)")
    parser.add_argument("--web-threads", type=int, default=2, help="threads per web process (WEB_THREADS)")
    parser.add_argument("--ws-workers", type=int, default=1, help="uvicorn processes (the Procfile's WS_WORKERS)")
    parser.add_argument("--empty-database-url", help="the baseline's database (default: DATABASE_URL's name + _empty)")
    parser.add_argument("--empty-redis-url", help="the baseline's Redis (default: REDIS_URL's database number - 1)")
    parser.add_argument("--telemetry-period", type=float, default=1.0,
                        help="seconds between an agent's batches (the agent's default and the issue's: 1)")
    parser.add_argument("--telemetry-over", choices=["websocket", "http"], default="websocket",
                        help="how agents send: frames on /ws/agent/telemetry/ (the agent's default) or HTTP POSTs")
    parser.add_argument("--seed", type=int, default=24)
    parser.add_argument("--json", type=Path, help="write the results here")
    # Children: the builder and the two load processes.
    parser.add_argument("--build", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--load", choices=["agents", "users"], help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--http", help=argparse.SUPPRESS)
    parser.add_argument("--ws", help=argparse.SUPPRESS)
    parser.add_argument("--fleet-file", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--start", type=float, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)

    if args.build:
        result = build(args.gpus, args.teams, args.users, args.history_per_team, args.seed)
        args.build.write_text(json.dumps(result))
        return 0
    if args.load:
        fleet = json.loads(args.fleet_file.read_text())
        window = Window(args.start, args.warmup, args.seconds)
        if args.load == "agents":
            stats = _loop_runner()(run_agents(args.http, args.ws, fleet["hosts"], window, args.telemetry_period,
                                              args.telemetry_over))
            stats.pop("stop")
        else:
            stats = _loop_runner()(run_users(args.http, args.ws, fleet, args.users, args.think, args.watchers,
                                             window, args.seed))
        import resource

        # Its own peak, as the parent's /proc read misses a load process that has already exited (a zombie
        # has no VmHWM): Linux gives ru_maxrss in KiB.
        stats["peak_rss_mib"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)
        args.out.write_text(json.dumps(stats))
        return 0

    database_url, redis_url = os.environ.get("DATABASE_URL", ""), os.environ.get("REDIS_URL", "")
    if not database_url.startswith("postgres") or not redis_url or not os.environ.get("SECRET_KEY"):
        raise SystemExit("set DATABASE_URL (PostgreSQL; the benchmark drops and recreates it), REDIS_URL "
                         "(it empties that database) and SECRET_KEY")
    empty_db, empty_redis = _default_empty_urls(database_url, redis_url)
    empty_db, empty_redis = args.empty_database_url or empty_db, args.empty_redis_url or empty_redis
    if empty_db == database_url or empty_redis == redis_url:
        raise SystemExit("the empty portal needs its own database and Redis database")
    empty = run_portal("empty", empty_db, empty_redis, {"gpus": GPUS_PER_HOST, "teams": 1, "users": 1,
                                                         "history_per_team": 0, "load_users": args.users}, args)
    fleet = run_portal("fleet", database_url, redis_url, {"gpus": args.gpus, "teams": args.teams,
                                                          "users": args.users, "history_per_team": args.history_per_team,
                                                          "load_users": args.users}, args)
    rows = compare(empty, fleet)
    result = {
        "command": "python -m benchmarks.fleet " + " ".join(sys.argv[1:] if argv is None else argv),
        "gpus": args.gpus, "teams": args.teams, "users": args.users, "seconds": args.seconds,
        "warmup": args.warmup, "think_s": args.think, "telemetry_period_s": args.telemetry_period,
        "telemetry_over": args.telemetry_over,
        "cpu_count": os.cpu_count(),
        "web_workers": args.web_workers, "web_threads": args.web_threads, "ws_workers": args.ws_workers,
        "targets_ms": {"page_p95": TARGET_MS["page"], "api_p95": TARGET_MS["api"]},
        "all_met": all(row["met"] for row in rows), "comparison": rows, "empty": empty, "fleet": fleet,
    }
    print(f"\nFleet: {fleet['rows']}; setup {fleet['setup_s']} s. Empty portal: 1 host, 1 team, 1 user; "
          f"setup {empty['setup_s']} s. {args.users} user clients (think {args.think:g} s) on each, "
          f"{args.seconds:g} s measured after {args.warmup:g} s warm-up.")
    print(format_table(rows))
    for label, portal in (("empty", empty), ("fleet", fleet)):
        t = portal["telemetry"]
        print(f"[{label}] telemetry: offered {t['offered_samples_per_s']} samples/s, achieved "
              f"{t['achieved_samples_per_s']}, refused {t['refused_samples']}, late {t['late_samples']}, POSTed while the "
              f"socket was down {t['sent_over_http_while_socket_down']} batches, held while it was busy "
              f"{t['held_while_socket_busy']} ticks, dropped {t['buffer_dropped']}; lease "
              f"channels open {portal['lease_channels']['open_at_start']}/{t['hosts']}; heartbeats "
              f"{portal['heartbeats']['answered']} (and {portal['heartbeats']['lease_polls']} lease polls), hosts silent at the end {portal['hosts_unhealthy_at_end']}; machine busy "
              f"{portal['machine_busy_fraction']:.0%}; celery queue at end {portal['celery_queue_at_end']}")
        print(f"[{label}] processes: " + ", ".join(
            f"{name} {p['cpu_s']} CPU s ({p['cores']} cores), peak RSS {p['peak_rss_mib']} MiB"
            for name, p in portal["processes"].items()))
        if portal["errors"] or portal["server_log_errors"]:
            print(f"[{label}] errors: {portal['errors']} {portal['server_log_errors'][-3:]}")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
