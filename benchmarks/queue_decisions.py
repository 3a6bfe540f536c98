"""What a queue pass decides, to compare two commits: `python -m benchmarks.queue_decisions --json FILE` (DATABASE_URL
must name PostgreSQL), then the same on the other commit and `python -m benchmarks.queue_decisions --compare A B`
(with `--except-likely`, likely_start left out: where only the estimate changed).

Builds the queue benchmark's pass pool (benchmarks.queue.pass_setup: `--nodes` nodes of the trace's node list, every
GPU held by a trace task at a random point of its booking, `--seed`), queues `--queue` whole-GPU requests of the
trace's tasks (benchmarks.queue.pass_tasks: the trace's mix of sizes, some asking 2, 4 or 8 GPUs, as the timed pass),
and runs three passes: one without promises, one with the first's promises held, and one `--later-hours` later,
when bookings have ended and requests start. After each it writes, per request in the order it was queued, its
state, position, reason, start_by, likely_start and planned GPUs (by node name and index, as ids differ between
runs). A change meant to make the pass faster must leave these the same.
"""
from __future__ import annotations

import argparse
import json
import logging
from datetime import timedelta
from pathlib import Path

from benchmarks.api import django_on_postgresql


def decisions(*, nodes: int, queue_size: int, seed: int, later_hours: float) -> list[dict]:
    from allocations import queue
    from allocations.models import QueueEntry, Reservation
    from benchmarks import queue as bench
    from inventory.models import Gpu

    bench.clear()
    tasks = bench.pass_tasks(bench.DEFAULT_TRACE, skip=1000, max_hours=24.0, teams=4)  # the trace's mix of sizes
    now = bench.EPOCH + timedelta(days=400)
    pool, users, team_ids, _ = bench.pass_setup(tasks, bench.sample_nodes(nodes, seed), 500, now, seed)
    bench.add_waiters(pool, users, team_ids, tasks, queue_size, now)
    gpu_name = {g.pk: f"{g.node.name}/{g.index}" for g in Gpu.objects.filter(pool=pool).select_related("node")}
    ids = list(Reservation.objects.filter(pool=pool, state="pending").order_by("pk").values_list("pk", flat=True))
    passes = []
    with bench.Kicks():
        for at in (now, now, now + timedelta(hours=later_hours)):
            counts = queue.queue_pass(pool_id=pool.pk, now=at)
            entries = {e.pk: e for e in QueueEntry.objects.filter(reservation_id__in=ids)}
            states = dict(Reservation.objects.filter(pk__in=ids).values_list("pk", "state"))
            passes.append({"counts": counts, "requests": [
                [states[r], entries[r].position, entries[r].reason,
                 *(t.isoformat() if t else None for t in (entries[r].start_by, entries[r].likely_start)),
                 [gpu_name[g] for g in entries[r].planned_gpus or []]] for r in ids]})
    bench.clear()
    return passes


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", type=Path, help="write this run's decisions here")
    parser.add_argument("--compare", type=Path, nargs=2, metavar=("A", "B"), help="compare two runs' files")
    parser.add_argument("--nodes", type=int, default=1213)
    parser.add_argument("--queue", type=int, default=1000)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--later-hours", type=float, default=3.0)
    parser.add_argument("--except-likely", action="store_true",
                        help="with --compare: leave likely_start out (a change to the estimate alone moves it)")
    args = parser.parse_args(argv)
    if args.compare:
        a, b = (json.loads(path.read_text()) for path in args.compare)
        if args.except_likely:  # each request's row: state, position, reason, start_by, likely_start, GPUs
            a, b = ([{**p, "requests": [r[:4] + r[5:] for r in p["requests"]]} for p in run] for run in (a, b))
        differ = [(k, i) for k, (x, y) in enumerate(zip(a, b, strict=True))
                  for i, (r, s) in enumerate(zip(x["requests"], y["requests"], strict=True)) if r != s]
        same = not differ and [x["counts"] for x in a] == [y["counts"] for y in b]
        print("the same decisions" if same else f"{len(differ)} requests differ, first (pass, request): {differ[:5]}")
        return 0 if same else 1
    django_on_postgresql()
    from django.core.management import call_command

    logging.getLogger("common.notifications").setLevel(logging.WARNING)
    call_command("migrate", verbosity=0)
    passes = decisions(nodes=args.nodes, queue_size=args.queue, seed=args.seed, later_hours=args.later_hours)
    print("passes:", [p["counts"] for p in passes])
    if args.json:
        args.json.write_text(json.dumps(passes))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
