"""CPU per reservation API call: `python -m benchmarks.api_cpu --calls 200 --json FILE`.

The throughput benchmark (`benchmarks.api`) runs a portal under load, and its figures move
by ±20% from run to run on a small shared machine. This one measures what a change to the
request path does, in one process and one thread: each call goes through Django's
middleware, DRF and the services against the real PostgreSQL and Redis (Django's test
client stands in for the HTTP server), and the CPU time of the process is read around it.
`/healthz` through the same client is the baseline beside it, so runs on a machine whose
speed drifts compare by their ratios.

The request rounds book ahead (nothing starts at once). Then, with --worker-calls, the
worker's share of a reservation that starts at once: `activate` (scheduled → applying and
its apply job queued), `apply job` (the job run against the cluster's backend: the
benchmark's hosts run no agent, so it ends at once, as for a host added by hand) and,
after the release, `undo job`; each task's service called in this process as the Celery
worker calls it (Celery's own message handling is not in these figures). The messages the
requests queue are removed from the broker at the end. Needs DATABASE_URL (PostgreSQL),
REDIS_URL and SECRET_KEY, like `benchmarks.api`, whose fixtures it shares.
"""
from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

from benchmarks.api import django_on_postgresql, write_json

CALLS = ("healthz", "create", "release", "list")
WORKER_CALLS = ("activate", "apply job", "undo job")


def measure(calls: int, warmup: int, seed: int, worker_calls: int = 0) -> dict[str, list[float]]:
    """CPU milliseconds of each call, by call name."""
    from django.test import Client

    from benchmarks.api import prepare, reservation_body

    pairs = prepare(pools=16, teams=32, nodes_per_pool=4, gpus_per_node=8)
    client = Client()
    rng = random.Random(seed)
    cpu_ms: dict[str, list[float]] = {name: [] for name in CALLS + (WORKER_CALLS if worker_calls else ())}

    def timed(name: str, record: bool, send, *args, **kwargs):
        started = time.process_time()
        response = send(*args, **kwargs)
        if record:
            cpu_ms[name].append((time.process_time() - started) * 1000)
        return response

    for i in range(warmup + calls):
        record = i >= warmup
        pair = pairs[i % len(pairs)]
        headers = {"HTTP_AUTHORIZATION": f"Token {pair['token']}"}
        start = datetime.now(timezone.utc) + timedelta(minutes=rng.randrange(10, 7 * 24 * 60))
        body = reservation_body(pair, start, rng)
        timed("healthz", record, client.get, "/healthz")
        created = timed("create", record, client.post, "/api/v1/reservations/", json.dumps(body),
                        content_type="application/json", **headers)
        if created.status_code != 201:
            raise SystemExit(f"create answered {created.status_code}: {created.content[:300]!r}")
        timed("release", record, client.post, f"/api/v1/reservations/{created.json()['id']}/release/", **headers)
        timed("list", record, client.get, "/api/v1/reservations/?limit=20", **headers)
    if worker_calls:
        measure_worker(cpu_ms, timed, client, pairs, worker_calls, warmup, rng)
    return cpu_ms


def measure_worker(cpu_ms, timed, client, pairs, calls: int, warmup: int, rng: random.Random) -> None:
    """The worker's tasks for reservations that start at once, called as the tasks call them."""
    from benchmarks.api import reservation_body

    from allocations import services
    from allocations.apply import jobs
    from allocations.models import ApplyJob
    from config.celery import app

    def open_job(reservation_id: int, action: str) -> int:
        return ApplyJob.objects.filter(reservation_id=reservation_id, action=action).order_by("-pk").values_list(
            "pk", flat=True)[0]

    for i in range(warmup + calls):
        record = i >= warmup
        pair = pairs[(i * 7) % len(pairs)]
        headers = {"HTTP_AUTHORIZATION": f"Token {pair['token']}"}
        body = json.dumps(reservation_body(pair, datetime.now(timezone.utc), rng))
        created = client.post("/api/v1/reservations/", body,
                              content_type="application/json", **headers)
        if created.status_code != 201:
            raise SystemExit(f"create answered {created.status_code}: {created.content[:300]!r}")
        reservation_id = created.json()["id"]
        if not timed("activate", record, services.reservation_activate, reservation_id=reservation_id):
            raise SystemExit(f"reservation {reservation_id} was not activated")
        status = timed("apply job", record, jobs.job_run, job_id=open_job(reservation_id, ApplyJob.Action.APPLY))
        if status != ApplyJob.Status.SUCCEEDED:
            raise SystemExit(f"apply job of reservation {reservation_id} ended {status!r}")
        client.post(f"/api/v1/reservations/{reservation_id}/release/", **headers)
        status = timed("undo job", record, jobs.job_run, job_id=open_job(reservation_id, ApplyJob.Action.UNDO))
        if status != ApplyJob.Status.SUCCEEDED:
            raise SystemExit(f"undo job of reservation {reservation_id} ended {status!r}")
    with app.connection_for_write() as connection:
        app.control.purge(connection=connection)


def summarize(cpu_ms: dict[str, list[float]]) -> dict[str, dict[str, float]]:
    base = statistics.median(cpu_ms["healthz"])
    out = {}
    for name in cpu_ms:
        values = cpu_ms[name]
        median = statistics.median(values)
        out[name] = {"calls": len(values), "cpu_ms_median": round(median, 3),
                     "cpu_ms_mean": round(statistics.fmean(values), 3), "vs_healthz": round(median / base, 2)}
    return out


def format_table(summary: dict[str, dict[str, float]]) -> str:
    lines = [f"{'call':<12}{'calls':>8}{'CPU ms (median)':>18}{'mean':>10}{'× healthz':>12}"]
    for name, row in summary.items():
        lines.append(f"{name:<12}{row['calls']:>8}{row['cpu_ms_median']:>18}{row['cpu_ms_mean']:>10}"
                     f"{row['vs_healthz']:>12}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.api_cpu", description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=200, help="measured rounds of healthz, create, release, list")
    parser.add_argument("--warmup", type=int, default=30)
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--worker-calls", type=int, default=100,
                        help="reservations starting at once whose worker tasks are measured (0: none)")
    parser.add_argument("--json", type=Path, help="write the results here")
    args = parser.parse_args(argv)
    django_on_postgresql()
    summary = summarize(measure(args.calls, args.warmup, args.seed, args.worker_calls))
    print(f"CPU per API call in one process ({args.calls} rounds after {args.warmup} warm-up)")
    print(format_table(summary))
    write_json(args.json, {"calls": args.calls, "results": summary})
    return 0


if __name__ == "__main__":
    sys.exit(main())
