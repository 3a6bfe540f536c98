"""How fast could the reservation API be on this machine? `python -m benchmarks.api_floor`.

`benchmarks.api` measures the whole stack: load generator, HTTP server, Django, DRF, the
services, PostgreSQL and the Celery worker, all on the same cores. This one takes layers
away to find the ceiling beneath it, with the same fixtures and the same request mix
(1, 2 or 4 GPUs for 30 minutes, booked up to a week ahead, in 16 pools by 32 teams):

- `service`: worker processes call `services.reservation_create` and
  `services.reservation_release` directly, as the API view does, on the portal's own
  database settings. No HTTP, no load generator, no DRF, no Celery worker.
- `sql`: the statements those two services run (as of this commit: the pool lock with
  the team and quota read, the pool's GPUs with their clashes, the team's windows, three
  INSERTs; then the reservation lock, two UPDATEs, an INSERT and the allocated GPUs),
  sent straight through psycopg with prepared statements. No Django at all: what the
  database itself and the thinnest client cost.

A cycle is one create and its release. Each tier runs `--connections` clients in
`--processes` processes for `--seconds`, and reads the CPU the PostgreSQL server used
(its processes' own and reaped children's time from /proc, so it must run on the
database's machine) and the CPU the client processes used. Together they say how many
milliseconds of the machine one cycle costs, which caps cycles/s at cores / that, before
any HTTP is spoken.
"""
from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import random
import resource
import sys
import threading
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

from benchmarks.api import _pct, django_on_postgresql, write_json

TIERS = ("sql", "service")


def postgres_cpu_seconds() -> float:
    """CPU seconds used so far by every process named postgres, counting exited backends (the
    postmaster's reaped children). Needs to see the server's processes in /proc."""
    ticks = 0
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/comm") as comm:
                if not comm.read().startswith("postgres"):
                    continue
            with open(f"/proc/{pid}/stat") as stat:
                fields = stat.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        ticks += sum(int(value) for value in fields[11:15])  # utime, stime, cutime, cstime
    return ticks / os.sysconf("SC_CLK_TCK")


def _window(rng: random.Random) -> tuple[datetime, datetime, int]:
    start = datetime.now(timezone.utc) + timedelta(minutes=rng.randrange(10, 7 * 24 * 60))
    return start, start + timedelta(minutes=30), rng.choice((1, 1, 2, 4))


# --- the service tier ------------------------------------------------------------------------

def _service_client(pairs: list[dict], deadline: float, seed: int, out: list) -> None:
    from django.contrib.auth import get_user_model
    from django.db import connection

    from allocations import services
    from common.errors import Conflict

    users = {user.username: user for user in get_user_model().objects.filter(username__startswith="bench-user-")}
    rng = random.Random(seed)
    latencies, refused = [], 0
    while time.monotonic() < deadline:
        pair = pairs[rng.randrange(len(pairs))]
        actor = users[pair["team"].replace("team", "user")]
        start, end, gpus = _window(rng)
        started = time.perf_counter()
        try:
            reservation = services.reservation_create(actor=actor, request=services.ReservationRequest(
                team=pair["team"], pool=pair["pool"], gpus=gpus, starts_at=start, ends_at=end))
        except Conflict:
            refused += 1
            continue
        latencies.append((time.perf_counter() - started) * 1000)
        services.reservation_release(actor=actor, reservation_id=reservation.pk)
    connection.close()
    out.append((latencies, refused))


# --- the sql tier ------------------------------------------------------------------------------

LOCK_POOL = (
    "SELECT p.id, p.sharing_mode, p.sharing_config, p.placement_policy, p.queueing, p.backfill, p.borrowing, "
    "p.queue_ordering, t.id, m.role, q.max_ge, "
    "q.ge_hours_per_month, q.id IS NOT NULL, t.max_ge, pc.name, pc.value, q.max_borrow_ge, t.name, p.name, "
    "pc.preemptible FROM inventory_gpupool p JOIN teams_team t ON t.slug = %s "
    "LEFT JOIN teams_membership m ON m.team_id = t.id AND m.user_id = %s "
    "LEFT JOIN allocations_quota q ON q.team_id = t.id AND q.pool_id = p.id "
    "LEFT JOIN allocations_priorityclass pc ON pc.id = q.priority_class_id WHERE p.slug = %s FOR UPDATE OF p")
POOL_GPUS = (
    'SELECT g.id, g.node_id, n.name, g."index", g.uuid, g.model_name, g.memory_mib, '
    "g.healthy AND n.healthy AND n.schedulable, "
    "n.cpu_milli, n.memory_mib, m.weight, g.mig_devices FROM inventory_gpu g JOIN inventory_node n "
    "ON n.id = g.node_id LEFT JOIN inventory_gpumodel m ON m.name = g.model_name "
    'WHERE g.pool_id = %s ORDER BY n.name, g.node_id, g."index"')
# Windows are read as epoch microseconds (common.sql.instant_column on PostgreSQL).
EPOCH_US = "(extract(epoch from {}) * 1000000)::bigint"
POOL_GRANTS = (
    f"SELECT a.gpu_id, a.reservation_id, {EPOCH_US.format('a.starts_at')}, {EPOCH_US.format('a.ends_at')}, a.milli, a.mig_profile, a.mig_start, a.mode, "
    "a.share_from, a.share_to, a.memory_mib, a.cores_pct "
    "FROM allocations_allocation a WHERE a.gpu_id = ANY(ARRAY(SELECT g.id FROM inventory_gpu g WHERE g.pool_id = %s)) "
    "AND a.starts_at < %s AND a.ends_at > %s AND a.ends_at > a.starts_at")
TEAM_WINDOWS = (
    f"SELECT {EPOCH_US.format('a.starts_at')}, {EPOCH_US.format('a.ends_at')}, sum(a.ge) FROM allocations_allocation a JOIN allocations_reservation r "
    "ON r.id = a.reservation_id WHERE r.team_id = %s AND r.ends_at > %s "
    "AND a.starts_at < %s AND a.ends_at > %s AND a.ends_at > a.starts_at AND r.pool_id = %s "
    "GROUP BY a.starts_at, a.ends_at")
INSERT_RESERVATION = (
    "INSERT INTO allocations_reservation (team_id, pool_id, requested_by_id, mode, gpus, shares, mig_profile, "
    "mig_count, gpu_memory_mib, gpu_cores_pct, gpu_models, ge, borrowed_ge, requeue, priority, priority_class, "
    "preemptible, starts_at, ends_at, state, reason, ended_at, created_at, updated_at) "
    f"VALUES ({', '.join(['%s'] * 20)}, '', NULL, %s, %s) RETURNING id")
INSERT_ALLOCATION = (
    "INSERT INTO allocations_allocation (reservation_id, gpu_id, starts_at, ends_at, mode, ge, share_from, "
    "share_to, milli, mig_profile, mig_start, memory_mib, cores_pct) VALUES ")
# `reason` in English and `reason_message`, what it was made of (allocations.messages: read in each
# reader's language).
INSERT_EVENT = (
    "INSERT INTO allocations_reservationevent (reservation_id, from_state, to_state, actor_id, at, reason, "
    "reason_message) VALUES (%s, %s, %s, %s, %s, %s, %s) RETURNING id")
# Each event's audit entry (audit.services.audit_record).
INSERT_AUDIT_ENTRY = (
    "INSERT INTO audit_auditentry (content_type_id, object_pk, object_id, object_repr, action, changes_text, "
    "changes, actor_id, actor_username, actor_email, timestamp, additional_data, source) "
    "VALUES (%s, %s, %s, %s, %s, '', %s, %s, %s, %s, %s, %s, %s)")
LOCK_RESERVATION = (
    "SELECT r.id, r.mode, r.gpus, r.shares, r.mig_profile, r.mig_count, r.gpu_memory_mib, r.gpu_cores_pct, r.gpu_models, "
    "r.ge, r.borrowed_ge, r.priority_class, r.preemptible, r.preempt_at, r.starts_at, r.ends_at, r.state, r.reason, r.reason_message, r.ended_at, r.created_at, r.updated_at, "
    "r.team_id, t.slug, r.pool_id, p.slug, r.requested_by_id, u.username, m.role "
    "FROM allocations_reservation r JOIN teams_team t ON t.id = r.team_id "
    "JOIN inventory_gpupool p ON p.id = r.pool_id LEFT JOIN auth_user u ON u.id = r.requested_by_id "
    "LEFT JOIN teams_membership m ON m.team_id = r.team_id AND m.user_id = %s WHERE r.id = %s FOR UPDATE OF r")
# Whether anyone waits in the pool's queue (allocations.queue.has_waiting, the ORM's EXISTS): a create asks it
# before it books (the queue's promises).
HAS_WAITING = (
    'SELECT %s AS "a" FROM "allocations_reservation" WHERE ("allocations_reservation"."pool_id" = %s AND '
    '"allocations_reservation"."state" = %s AND NOT ("allocations_reservation"."id" IS NULL)) LIMIT 1')
# Whether the pool is worth a pass (allocations.queue.kick): someone waits, or a reclaim notice stands. A release
# asks it before it kicks one.
WORTH_A_PASS = (
    'SELECT %s AS "a" FROM "allocations_reservation" WHERE (("allocations_reservation"."state" = %s OR '
    '("allocations_reservation"."preempt_at" IS NOT NULL AND "allocations_reservation"."state" IN (%s, %s, %s))) '
    'AND "allocations_reservation"."pool_id" = %s) LIMIT 1')
CANCEL_ALLOCATIONS = "UPDATE allocations_allocation SET ends_at = starts_at WHERE reservation_id = %s"
RELEASE_RESERVATION = (
    "UPDATE allocations_reservation SET state = %s, reason = %s, reason_message = %s, updated_at = %s, ended_at = %s "
    "WHERE id = %s")
ALLOCATED_GPUS = (
    'SELECT a.reservation_id, g.uuid, n.name, g."index", g.model_name, a.starts_at, a.ends_at, a.mode, '
    "a.milli, a.mig_profile, a.mig_start, a.memory_mib, a.cores_pct, a.ge, g.mig_devices, p.sharing_config "
    "FROM allocations_allocation a JOIN inventory_gpu g ON g.id = a.gpu_id JOIN inventory_node n ON n.id = g.node_id "
    "JOIN allocations_reservation r ON r.id = a.reservation_id JOIN inventory_gpupool p ON p.id = r.pool_id "
    'WHERE a.reservation_id = %s ORDER BY a.reservation_id, g.node_id, g."index", a.mig_start, a.share_from')


def _sql_client(dsn: str, ids: list[tuple], deadline: float, seed: int, out: list) -> None:
    import psycopg

    rng = random.Random(seed)
    latencies, refused = [], 0
    with psycopg.connect(dsn, autocommit=True, prepare_threshold=1) as conn:
        # Django's ContentType cache holds it after a process's first lookup: once per client here too.
        (reservation_type,) = conn.execute("SELECT id FROM django_content_type WHERE app_label = 'allocations' "
                                           "AND model = 'reservation'").fetchone()

        def audit(reservation_id, event_id, user_id, now, before, after, reason):
            conn.execute(INSERT_AUDIT_ENTRY, (
                reservation_type, str(reservation_id), reservation_id, f"reservation {reservation_id}",
                0 if not before else 1, json.dumps({"state": [before or None, after]}), user_id, f"user{user_id}",
                None, now, json.dumps({"reservation_event": event_id, "reason": reason}), "api"))

        while time.monotonic() < deadline:
            team_id, team_slug, pool_id, pool_slug, user_id = ids[rng.randrange(len(ids))]
            start, end, gpus = _window(rng)
            started = time.perf_counter()
            with conn.transaction():
                conn.execute(LOCK_POOL, (team_slug, user_id, pool_slug)).fetchall()
                conn.execute(HAS_WAITING, (1, pool_id, "pending")).fetchall()
                gpu_rows = conn.execute(POOL_GPUS, (pool_id,)).fetchall()
                held = {row[0] for row in conn.execute(POOL_GRANTS, (pool_id, end, start)).fetchall()}
                conn.execute(TEAM_WINDOWS, (team_id, start, end, start, pool_id)).fetchall()
                free = [row[0] for row in gpu_rows if row[7] and row[0] not in held][:gpus]
                if len(free) < gpus:
                    refused += 1
                    continue
                now = datetime.now(timezone.utc)
                (reservation_id,) = conn.execute(
                    INSERT_RESERVATION, (team_id, pool_id, user_id, "exclusive", gpus, None, "", None, None, None,
                                         "[]", float(gpus), 0.0, False, 0, "", False, start, end, "scheduled", now,
                                         now)).fetchone()
                conn.execute(INSERT_ALLOCATION + ", ".join(["(" + ", ".join(["%s"] * 13) + ")"] * gpus),
                             [v for gpu_id in free for v in (reservation_id, gpu_id, start, end, "exclusive", 1.0, 0,
                                                             1000, 1000, "", None, None, None)])
                placed = f"{gpus} GPUs placed ({gpus:.2f} GE)"
                (event_id,) = conn.execute(INSERT_EVENT, (reservation_id, "", "scheduled", user_id, now, placed, json.dumps(
                    {"id": "%(asked)s placed (%(ge)s GE)", "args": {"asked": f"{gpus} GPUs", "ge": f"{gpus:.2f}"}})
                )).fetchone()
                audit(reservation_id, event_id, user_id, now, "", "scheduled", placed)
            latencies.append((time.perf_counter() - started) * 1000)
            with conn.transaction():
                conn.execute(LOCK_RESERVATION, (user_id, reservation_id)).fetchall()
                conn.execute(WORTH_A_PASS, (1, "pending", "scheduled", "applying", "active", pool_id)).fetchall()
                conn.execute(CANCEL_ALLOCATIONS, (reservation_id,))
                now = datetime.now(timezone.utc)
                cancelled = json.dumps({"id": "Cancelled before its start by %(who)s.", "args": {"who": "bench"}})
                conn.execute(RELEASE_RESERVATION, ("released", "Cancelled before its start by bench.", cancelled, now, now,
                                                   reservation_id))
                (event_id,) = conn.execute(INSERT_EVENT, (reservation_id, "scheduled", "released", user_id, now,
                                                          "Cancelled before its start by bench.", cancelled)).fetchone()
                audit(reservation_id, event_id, user_id, now, "scheduled", "released", "Cancelled before its start by bench.")
            conn.execute(ALLOCATED_GPUS, (reservation_id,)).fetchall()
    out.append((latencies, refused))


def _fixtures() -> tuple[list[dict], list[tuple]]:
    """The (team, pool) pairs `benchmarks.api.prepare` made: as slugs for the services, as
    (team id, team slug, pool id, pool slug, member's user id) for the SQL."""
    from allocations.models import Quota

    quotas = Quota.objects.filter(team__slug__startswith="bench-team-", pool__slug__startswith="bench-pool-")
    rows = list(quotas.values_list("team_id", "team__slug", "pool_id", "pool__slug",
                                   "team__memberships__user_id").order_by("team_id", "pool_id"))
    return [{"team": row[1], "pool": row[3]} for row in rows], rows


# --- processes --------------------------------------------------------------------------------

def _cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _process(tier: str, threads: int, start_at: float, deadline: float, seed: int, queue) -> None:
    """One client process: set up, wait for start_at, then run `threads` clients of the tier until
    the deadline; puts (create latencies, refusals, CPU seconds from start_at on) on the queue."""
    os.environ["DB_POOL_MAX_SIZE"] = str(max(threads, 16))  # a pooled connection for each thread
    django_on_postgresql()
    pairs, ids = _fixtures()
    dsn = os.environ["DATABASE_URL"]
    if tier == "service":  # Django's imports and first queries belong to set-up, not to the cycles
        from allocations import services  # noqa: F401
    time.sleep(max(0.0, start_at - time.monotonic()))
    cpu_before = _cpu_seconds()
    out: list = []
    if tier == "service":
        targets = [(_service_client, (pairs, deadline, seed * 1000 + i, out)) for i in range(threads)]
    else:
        targets = [(_sql_client, (dsn, ids, deadline, seed * 1000 + i, out)) for i in range(threads)]
    workers = [threading.Thread(target=target, args=args) for target, args in targets]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    queue.put(([ms for latencies, _ in out for ms in latencies], sum(refused for _, refused in out),
               _cpu_seconds() - cpu_before))


def run_tier(tier: str, processes: int, connections: int, seconds: float, seed: int) -> dict:
    context = multiprocessing.get_context("spawn")
    queue = context.Queue()
    start_at = time.monotonic() + 8  # the processes set Django up first; the clock starts together
    per_process = [connections // processes + (1 if i < connections % processes else 0) for i in range(processes)]
    children = [context.Process(target=_process, args=(tier, n, start_at, start_at + seconds, seed + i, queue))
                for i, n in enumerate(per_process)]
    for child in children:
        child.start()
    time.sleep(max(0.0, start_at - time.monotonic()))
    pg_before, wall_before = postgres_cpu_seconds(), time.monotonic()
    results = [queue.get() for _ in children]
    wall = time.monotonic() - wall_before
    pg_cpu = postgres_cpu_seconds() - pg_before
    for child in children:
        child.join()
    latencies = [ms for result in results for ms in result[0]]
    cycles = len(latencies)
    client_cpu = sum(result[2] for result in results)
    return {
        "tier": tier, "processes": processes, "connections": connections, "seconds": round(wall, 1),
        "cycles": cycles, "cycles_per_s": round(cycles / wall, 1), "refused": sum(result[1] for result in results),
        "create_p50_ms": round(_pct(latencies, 50), 2), "create_p99_ms": round(_pct(latencies, 99), 2),
        "postgres_cpu_ms_per_cycle": round(pg_cpu / cycles * 1000, 2) if cycles else None,
        "client_cpu_ms_per_cycle": round(client_cpu / cycles * 1000, 2) if cycles else None,
        "postgres_cores": round(pg_cpu / wall, 2),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.api_floor", description=__doc__.split("\n\n")[0])
    parser.add_argument("--tiers", default=",".join(TIERS), help="comma-separated, of: " + ", ".join(TIERS))
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--connections", type=int, default=16, help="clients in all, shared out over the processes")
    parser.add_argument("--seconds", type=float, default=20)
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--json", type=Path, help="write the results here")
    args = parser.parse_args(argv)
    tiers = [tier.strip() for tier in args.tiers.split(",") if tier.strip()]
    if unknown := set(tiers) - set(TIERS):
        parser.error(f"unknown tier(s): {', '.join(sorted(unknown))}")
    django_on_postgresql()
    from benchmarks.api import prepare

    prepare(pools=16, teams=32, nodes_per_pool=4, gpus_per_node=8)  # also clears earlier runs' reservations
    cores = os.cpu_count() or 1
    rows = [run_tier(tier, args.processes, args.connections, args.seconds, args.seed) for tier in tiers]
    print(f"Create + release cycles without the HTTP stack ({cores} cores, {args.connections} clients "
          f"in {args.processes} processes, {args.seconds:.0f} s)")
    print(f"{'tier':<9}{'cycles/s':>10}{'p50 ms':>9}{'p99 ms':>9}{'PG ms/cycle':>13}{'client ms':>11}"
          f"{'ceiling/s':>11}")
    for row in rows:
        per_cycle = (row["postgres_cpu_ms_per_cycle"] or 0) + (row["client_cpu_ms_per_cycle"] or 0)
        row["ceiling_cycles_per_s"] = round(cores * 1000 / per_cycle, 1) if per_cycle else None
        print(f"{row['tier']:<9}{row['cycles_per_s']:>10}{row['create_p50_ms']:>9}{row['create_p99_ms']:>9}"
              f"{row['postgres_cpu_ms_per_cycle']:>13}{row['client_cpu_ms_per_cycle']:>11}"
              f"{row['ceiling_cycles_per_s']:>11}")
    print("ceiling/s: the cores divided by the CPU one cycle took (PostgreSQL + client), i.e. this tier's "
          "rate with every core busy and nothing else running")
    write_json(args.json, {"cores": cores, "tiers": rows})
    return 0


if __name__ == "__main__":
    sys.exit(main())
