"""Reservation API benchmark: `python -m benchmarks.api --concurrency 32 --seconds 30 --json FILE`.

Drives the REST API of a running portal on PostgreSQL — create and release of short
reservations across many pools and teams, plus list calls — and prints requests/s and
latency p50/p95/p99 per call. Before the mix it runs a baseline at the same concurrency
against /healthz (the cheapest request the stack serves), so the figures come with a
ratio measured beside them in the same run. At the end it checks the database for
double bookings (two allocations of one GPU with overlapping windows).

It needs the portal's DATABASE_URL (to create the benchmark's pools, teams and tokens,
and for the final check). Either point it at a running portal with --url, or let it
start one with --serve: the web server as the Procfile runs it (`python -m config.web`)
plus a Celery worker. A quarter of the reservations start at once, so the worker has
activations to do; here it shares the cores with the web server, PostgreSQL and the load
generator (--worker-nice lowers its priority, as if it had cores of its own). The Celery
queue left at the end is reported: what the worker had not got to.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import subprocess
import sys
import time
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from pathlib import Path

from benchmarks.common import percentile as _pct  # noqa: F401 - kept for callers of benchmarks.api._pct
from benchmarks.common import summarize_calls

ROOT = Path(__file__).resolve().parent.parent
BENCH_PREFIX = "bench"


# --- fixtures in the database ------------------------------------------------------------

def _django() -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
    import django

    django.setup()


def django_on_postgresql() -> None:
    """For the in-process benchmarks: stop unless DATABASE_URL names PostgreSQL, then set Django up."""
    if not os.environ.get("DATABASE_URL", "").startswith("postgres"):
        raise SystemExit("set DATABASE_URL to a PostgreSQL database (and REDIS_URL, SECRET_KEY)")
    _django()


def write_json(path: Path | None, result: dict) -> None:
    if path:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(result, indent=2) + "\n")


def prepare(pools: int, teams: int, nodes_per_pool: int, gpus_per_node: int) -> list[dict]:
    """Create (idempotently) the benchmark fleet and accounts; clear earlier benchmark reservations.

    Returns one {"team", "pool", "token"} per (team, pool) pair the load may use.
    """
    _django()
    from django.contrib.auth import get_user_model
    from django.core.management import call_command
    from django.db import transaction

    from allocations.models import Quota
    from inventory.models import Cluster, Gpu, GpuPool, Node
    from teams.models import Membership, Team
    from teams.services import api_token_create

    call_command("migrate", verbosity=0)
    with transaction.atomic():
        clear_reservations()
        cluster, _ = Cluster.objects.get_or_create(slug=f"{BENCH_PREFIX}-lab", defaults={
            "name": "Benchmark fleet", "kind": Cluster.Kind.BAREMETAL})
        pool_rows = []
        for p in range(pools):
            pool, _ = GpuPool.objects.get_or_create(slug=f"{BENCH_PREFIX}-pool-{p}", defaults={
                "name": f"Benchmark pool {p}", "sharing_mode": "exclusive"})
            pool_rows.append(pool)
            for n in range(nodes_per_pool):
                node, created = Node.objects.get_or_create(cluster=cluster, name=f"{BENCH_PREFIX}-p{p}-n{n}")
                if created:
                    Gpu.objects.bulk_create(
                        Gpu(node=node, pool=pool, index=i, uuid=f"GPU-{BENCH_PREFIX}-{p}-{n}-{i}",
                            model_name="Benchmark GPU", memory_mib=81920)
                        for i in range(gpus_per_node)
                    )
        User = get_user_model()
        pairs = []
        for t in range(teams):
            team, _ = Team.objects.get_or_create(slug=f"{BENCH_PREFIX}-team-{t}", defaults={"name": f"Bench {t}"})
            user, created = User.objects.get_or_create(username=f"{BENCH_PREFIX}-user-{t}")
            if created:
                user.set_unusable_password()
                user.save()
            Membership.objects.get_or_create(user=user, team=team)
            _, key = api_token_create(user=user, name="benchmark")
            for pool in pool_rows:
                Quota.objects.update_or_create(team=team, pool=pool, defaults={
                    "max_ge": nodes_per_pool * gpus_per_node, "ge_hours_per_month": None})
                pairs.append({"team": team.slug, "pool": pool.slug, "token": key})
    vacuum_reservation_tables()
    return pairs


def vacuum_reservation_tables() -> None:
    """VACUUM ANALYZE what the runs write. Every run leaves its rows dead when the next one clears them;
    where autovacuum is off (as on our benchmark machine) or has not come round yet, the dead rows
    pile up and each run would be slower than the one before it."""
    from django.db import connection

    with connection.cursor() as cursor:
        for table in ("allocations_reservation", "allocations_allocation", "allocations_reservationevent",
                      "allocations_applyjob", "allocations_quota"):
            cursor.execute(f"VACUUM ANALYZE {table}")


def clear_reservations(pool_slug: str | None = None) -> None:
    """Remove the benchmark teams' reservations (in one pool, or all) and what hangs off them, in four
    statements (the ORM's cascade collects every row first, which a long history made too big for one query)."""
    from django.db import connection

    mine = ("SELECT r.id FROM allocations_reservation r JOIN teams_team t ON t.id = r.team_id "
            "JOIN inventory_gpupool p ON p.id = r.pool_id WHERE t.slug LIKE %s AND p.slug LIKE %s")
    params = [f"{BENCH_PREFIX}-%", pool_slug or "%"]
    with connection.cursor() as cursor:
        for table in ("allocations_allocation", "allocations_reservationevent", "allocations_applyjob"):
            cursor.execute(f"DELETE FROM {table} WHERE reservation_id IN ({mine})", params)
        cursor.execute(f"DELETE FROM allocations_reservation WHERE id IN ({mine})", params)


def double_bookings() -> int:
    """Pairs of allocations holding the same part of one GPU at one time (must be 0): two whole-GPU grants
    whose windows overlap, or two shares of a card over the same slots (vGPU grants are checked by sums,
    benchmarks.sharing.over_grants)."""
    _django()
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(
            """SELECT count(*) FROM allocations_allocation a JOIN allocations_allocation b
               ON a.gpu_id = b.gpu_id AND a.id < b.id AND a.mode <> 'vgpu' AND b.mode <> 'vgpu'
               AND a.starts_at < b.ends_at AND b.starts_at < a.ends_at
               AND a.share_from < b.share_to AND b.share_from < a.share_to"""
        )
        return int(cursor.fetchone()[0])


# --- the load ----------------------------------------------------------------------------

@dataclass
class Calls:
    latencies: dict[str, list[float]] = field(default_factory=lambda: defaultdict(list))
    statuses: dict[str, dict[int, int]] = field(default_factory=lambda: defaultdict(lambda: defaultdict(int)))

    def record(self, name: str, status: int, seconds: float) -> None:
        self.latencies[name].append(seconds * 1000)
        self.statuses[name][status] += 1


def reservation_body(pair: dict, start: datetime, rng: random.Random) -> dict:
    """A short reservation request of the benchmark mix: 1, 2 or 4 GPUs (1 most often) for 30 minutes."""
    return {"pool": pair["pool"], "team": pair["team"], "gpus": rng.choice((1, 1, 2, 4)),
            "starts_at": start.isoformat(), "ends_at": (start + timedelta(minutes=30)).isoformat()}


async def _timed(session, calls: Calls, name: str, method: str, url: str, **kwargs):
    started = time.perf_counter()
    async with session.request(method, url, **kwargs) as response:
        body = await response.read()
        calls.record(name, response.status, time.perf_counter() - started)
        return response.status, body


async def _baseline(base: str, concurrency: int, seconds: float) -> Calls:
    import aiohttp

    calls = Calls()
    deadline = time.monotonic() + seconds
    connector = aiohttp.TCPConnector(limit=concurrency)
    async with aiohttp.ClientSession(base, connector=connector) as session:
        async def loop() -> None:
            while time.monotonic() < deadline:
                await _timed(session, calls, "healthz", "GET", "/healthz")

        await asyncio.gather(*(loop() for _ in range(concurrency)))
    return calls


async def _mix(base: str, pairs: list[dict], concurrency: int, seconds: float, seed: int) -> Calls:
    import aiohttp

    calls = Calls()
    deadline = time.monotonic() + seconds
    rng = random.Random(seed)
    connector = aiohttp.TCPConnector(limit=concurrency)
    async with aiohttp.ClientSession(base, connector=connector) as session:
        async def loop(worker: int) -> None:
            iteration = 0
            while time.monotonic() < deadline:
                pair = pairs[(worker + iteration * concurrency) % len(pairs)]
                headers = {"Authorization": f"Token {pair['token']}"}
                now = datetime.now(timezone.utc)
                # A quarter start now (the worker activates them); the rest are booked ahead.
                start = now if rng.random() < 0.25 else now + timedelta(minutes=rng.randrange(10, 7 * 24 * 60))
                body = reservation_body(pair, start, rng)
                status, payload = await _timed(session, calls, "create", "POST", "/api/v1/reservations/",
                                               json=body, headers=headers)
                if status == 201:
                    rid = json.loads(payload)["id"]
                    await _timed(session, calls, "release", "POST", f"/api/v1/reservations/{rid}/release/",
                                 headers=headers)
                if iteration % 5 == 0:
                    await _timed(session, calls, "list", "GET", "/api/v1/reservations/?limit=20", headers=headers)
                iteration += 1

        await asyncio.gather(*(loop(w) for w in range(concurrency)))
    return calls


def _summary(calls: Calls, seconds: float) -> dict[str, dict]:
    return summarize_calls(calls.latencies, calls.statuses, seconds)


# --- serving -------------------------------------------------------------------------------

def _serve(port: int, workers: int, threads: int, worker_nice: int) -> list[subprocess.Popen]:
    env = dict(os.environ, PYTHONUNBUFFERED="1", LOG_LEVEL="WARNING")
    web = subprocess.Popen([sys.executable, "-m", "config.web", "--port", str(port), "--log-level", "warning",
                            *(["--workers", str(workers)] if workers else []),
                            *(["--threads", str(threads)] if threads else [])],
                           cwd=ROOT, env=env)
    worker = subprocess.Popen(["nice", "-n", str(worker_nice), sys.executable, "-m", "celery", "-A", "config",
                               "worker", "--pool=solo", "--loglevel=WARNING", "--without-mingle", "--without-gossip"],
                              cwd=ROOT, env=env)
    import urllib.request

    for _ in range(120):
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=2) as response:
                if response.status == 200:
                    return [web, worker]
        except OSError:
            time.sleep(0.5)
    for process in (web, worker):
        process.kill()
    raise SystemExit("the portal did not become ready")


def celery_queue_length() -> int | None:
    """Messages waiting in the Celery queue (Redis broker), or None without one."""
    url = os.environ.get("REDIS_URL")
    if not url:
        return None
    import redis

    return int(redis.Redis.from_url(url).llen("celery"))


def _empty_celery_queue() -> None:
    """Drop what an earlier run left queued: its reservations are gone, and the worker would spend this run on them."""
    url = os.environ.get("REDIS_URL")
    if url:
        import redis

        redis.Redis.from_url(url).delete("celery")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", default="http://127.0.0.1:8000", help="a running portal (ignored with --serve)")
    parser.add_argument("--serve", action="store_true", help="start the web server + a Celery worker for the run")
    parser.add_argument("--web-workers", type=int, default=0,
                        help="web server processes (default: config.web's, WEB_WORKERS or cores + 1)")
    parser.add_argument("--web-threads", type=int, default=0,
                        help="threads per web server process (default: config.web's, WEB_THREADS or 2)")
    parser.add_argument("--worker-nice", type=int, default=0,
                        help="niceness of the Celery worker started with --serve (0: as the web server)")
    parser.add_argument("--port", type=int, default=8077)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--seconds", type=float, default=30)
    parser.add_argument("--baseline-seconds", type=float, default=10)
    parser.add_argument("--pools", type=int, default=16)
    parser.add_argument("--teams", type=int, default=32)
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--json", type=Path, help="write the results here")
    args = parser.parse_args(argv)

    if not os.environ.get("DATABASE_URL", "").startswith("postgres"):
        raise SystemExit("set DATABASE_URL to the portal's PostgreSQL database (and REDIS_URL, SECRET_KEY)")
    pairs = prepare(args.pools, args.teams, nodes_per_pool=4, gpus_per_node=8)
    if args.serve:
        _empty_celery_queue()
    processes = _serve(args.port, args.web_workers, args.web_threads, args.worker_nice) if args.serve else []
    base = f"http://127.0.0.1:{args.port}" if args.serve else args.url.rstrip("/")
    try:
        baseline = _summary(asyncio.run(_baseline(base, args.concurrency, args.baseline_seconds)),
                            args.baseline_seconds)
        mix = _summary(asyncio.run(_mix(base, pairs, args.concurrency, args.seconds, args.seed)), args.seconds)
        queued = celery_queue_length()
    finally:
        for process in processes:
            process.terminate()
        for process in processes:
            process.wait(timeout=30)
    doubles = double_bookings()

    create = mix.get("create", {})
    created = create.get("statuses", {}).get("201", 0)
    result = {
        "url": base, "concurrency": args.concurrency, "seconds": args.seconds, "pools": args.pools,
        "teams": args.teams, "web_workers": args.web_workers if args.serve else None,
        "web_threads": args.web_threads if args.serve else None,
        "worker_nice": args.worker_nice if args.serve else None, "celery_queue_at_end": queued,
        "reservations_per_s": round(created / args.seconds, 1),
        "latency_ms_p50_create": create.get("p50_ms"), "latency_ms_p95_create": create.get("p95_ms"),
        "latency_ms_p99_create": create.get("p99_ms"),
        "double_bookings": doubles,
        "baseline_healthz_per_s": baseline["healthz"]["per_s"],
        "create_vs_baseline_throughput": round(create.get("per_s", 0) / baseline["healthz"]["per_s"], 3),
        "calls": mix, "baseline": baseline,
    }
    print(f"\nReservation API, concurrency {args.concurrency}, {args.seconds:.0f} s ({base})")
    print(f"{'call':<10}{'requests':>10}{'req/s':>10}{'p50 ms':>10}{'p95 ms':>10}{'p99 ms':>10}  statuses")
    for name, row in [("healthz*", baseline["healthz"])] + sorted(mix.items()):
        print(f"{name:<10}{row['requests']:>10}{row['per_s']:>10}{row['p50_ms']:>10}{row['p95_ms']:>10}"
              f"{row['p99_ms']:>10}  {row['statuses']}")
    print("* baseline, run first at the same concurrency")
    print(f"reservations created/s: {result['reservations_per_s']}   create p99: {result['latency_ms_p99_create']} ms"
          f"   create/baseline throughput: {result['create_vs_baseline_throughput']}   "
          f"double bookings: {doubles}")
    if queued is not None:
        print(f"Celery messages still queued at the end: {queued}")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=2))
    return 0 if doubles == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
