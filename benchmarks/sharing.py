"""Sharing benchmark: `python -m benchmarks.sharing --json FILE` (DATABASE_URL must name PostgreSQL).

Replays a stream of fractional GPU requests, built from the Alibaba trace's gpushare40
variant (../shared/data/alibaba-gpu-2023: its one-GPU tasks asking for part of a card),
through the real reservation service (`allocations.services.reservation_create`, in-process,
on PostgreSQL) into one pool per sharing mode:

* time_slicing, 4 replicas: a task of m milli-GPU asks for ceil(m / 250) shares;
* mig, every A100 80GB carved all-balanced (1g, 1g, 2g, 3g): the smallest of 1g.10gb,
  2g.20gb and 3g.40gb whose compute covers m (tasks above 3/7 of a card skipped);
* mig_dynamic: the same requests on a pool with a dynamic MIG layout (each GPU carved on
  demand, per window, at the engine's start slices);
* vgpu: m/10 % of the memory and of the cores.

Requests arrive in the trace's order, all for the same window, until what they ask for
reaches 100 % of the pool; the figure is the share of the pool's capacity left unallocated
then. The same stream is replayed through the placement engine alone (`place`, in memory,
its own fraction and MIG geometry, no database and no layouts) as the baseline, and the
difference is reported in percentage points. Then, in the same run, it times creates: the
same number of fractional creates and of whole-GPU creates (an exclusive pool of the same
size, one GPU each) on fresh pools, and reports creates/s of each and their ratio. At the
end it checks the database: no part of a card held twice at one time, no GPU's memory or
cores over-granted by vGPU grants.
"""
from __future__ import annotations

import argparse
import math
import time
from datetime import timedelta
from pathlib import Path

from benchmarks.api import BENCH_PREFIX, clear_reservations, django_on_postgresql, write_json
from benchmarks.placement_trace import TRACE_FILES, load_trace

MODEL = "NVIDIA A100-SXM4-80GB"
MEMORY_MIB = 81920
MIG_PROFILES = (("1g.10gb", 1), ("2g.20gb", 2), ("3g.40gb", 3))  # (profile, compute slices)


def fractional_tasks(limit: int | None = None) -> list[int]:
    """The milli-GPU of the trace's one-GPU fractional tasks, in arrival order."""
    trace = load_trace(TRACE_FILES["gpushare40"])
    order = sorted(range(len(trace)), key=lambda i: trace.creation[i] if trace.creation is not None else i)
    out = [int(trace.gpu_milli[i]) for i in order if trace.num_gpu[i] == 1 and 0 < trace.gpu_milli[i] < 1000]
    return out[:limit] if limit else out


def as_request(mode: str, milli: int) -> tuple[dict, int] | None:
    """A trace task as (API amount, the milli-GPU it holds when granted); None when the mode cannot take it."""
    if mode == "time_slicing":
        shares = math.ceil(milli / 250)
        return {"shares": shares}, shares * 250
    if mode in ("mig", "mig_dynamic"):
        for profile, compute in MIG_PROFILES:
            if milli <= round(1000 * compute / 7):
                return {"mig_profile": profile}, round(1000 * compute / 7)
        return None
    pct = max(1, math.ceil(milli / 10))
    return {"gpu_memory_pct": pct, "gpu_cores_pct": pct}, pct * 10


CONFIG = {"time_slicing": {"replicas": 4}, "mig": {"mig_layout": "all-balanced"}, "vgpu": {}, "exclusive": {},
          "mig_dynamic": {"dynamic": True}}
# The pool's sharing mode per benchmark row (the rows are modes, and the dynamic MIG layout).
POOL_MODE = {"mig_dynamic": "mig"}


def make_pool(mode: str, nodes: int, gpus_per_node: int, tag: str):
    """A fresh benchmark pool of `mode`, its team (quota far above the pool) and a member."""
    from django.contrib.auth import get_user_model

    from allocations.models import Quota
    from inventory.models import Cluster, Gpu, GpuPool, Node
    from teams.models import Membership, Team

    slug = f"{BENCH_PREFIX}-{tag}"
    clear_reservations(pool_slug=slug)
    GpuPool.objects.filter(slug=slug).delete()
    cluster, _ = Cluster.objects.get_or_create(slug=f"{BENCH_PREFIX}-lab", defaults={
        "name": "Benchmark fleet", "kind": Cluster.Kind.BAREMETAL})
    Node.objects.filter(cluster=cluster, name__startswith=f"{slug}-").delete()
    pool = GpuPool.objects.create(name=slug, slug=slug, sharing_mode=POOL_MODE.get(mode, mode),
                                  sharing_config=CONFIG[mode])
    for n in range(nodes):
        node = Node.objects.create(cluster=cluster, name=f"{slug}-{n:03d}", cpu_milli=96000, memory_mib=786432)
        Gpu.objects.bulk_create(Gpu(node=node, pool=pool, index=i, uuid=f"GPU-{slug}-{n}-{i}", model_name=MODEL,
                                    memory_mib=MEMORY_MIB, mig_capable=True) for i in range(gpus_per_node))
    team, _ = Team.objects.get_or_create(slug=f"{BENCH_PREFIX}-sharing", defaults={"name": "Sharing benchmark"})
    Quota.objects.create(team=team, pool=pool, max_ge=100000)
    user, _ = get_user_model().objects.get_or_create(username=f"{BENCH_PREFIX}-sharing")
    Membership.objects.get_or_create(user=user, team=team)
    return pool, team, user


def service_replay(mode: str, tasks: list[int], nodes: int, gpus_per_node: int) -> dict:
    """The stream through reservation_create until arrivals reach 100 % of the pool."""
    from django.utils import timezone

    from allocations import services
    from common.errors import ApplicationError

    pool, team, user = make_pool(mode, nodes, gpus_per_node, mode.replace("_", "-"))
    capacity = nodes * gpus_per_node * 1000
    start = timezone.now() + timedelta(days=1)
    end = start + timedelta(hours=4)
    asked = granted = placed = refused = 0
    for milli in tasks:
        request = as_request(mode, milli)
        if request is None:
            continue
        amount, held = request
        if asked + held > capacity:
            break
        asked += held
        try:
            services.reservation_create(actor=user, request=services.ReservationRequest(
                team=team.slug, pool=pool.slug, starts_at=start, ends_at=end, **amount))
            granted += held
            placed += 1
        except ApplicationError:
            refused += 1
    return {"requests": placed + refused, "placed": placed, "refused": refused,
            "unallocated_pct": 100 * (capacity - granted) / capacity, "asked_pct": 100 * asked / capacity}


def engine_replay(mode: str, tasks: list[int], nodes: int, gpus_per_node: int) -> dict:
    """The same stream through the placement engine alone, in memory (the portal policy)."""
    from allocations.placement import ClusterState, GpuInfo, NodeInfo, PlacementRequest, place

    state = ClusterState(nodes=[NodeInfo(id=n, cpu_milli=96000, memory_mib=786432, gpus=tuple(
        GpuInfo(id=(n, i), index=i, model=MODEL, memory_mib=MEMORY_MIB, mig_capable=True)
        for i in range(gpus_per_node))) for n in range(nodes)], holdings=[])
    capacity = nodes * gpus_per_node * 1000
    asked = granted = placed = refused = 0
    for k, milli in enumerate(tasks):
        request = as_request(mode, milli)
        if request is None:
            continue
        amount, held = request
        if asked + held > capacity:
            break
        asked += held
        if mode in ("mig", "mig_dynamic"):
            ask = PlacementRequest(mig_profile=amount["mig_profile"], start=0, end=1)
        elif mode == "vgpu":
            ask = PlacementRequest(milli=held, gpu_memory_mib=MEMORY_MIB * amount["gpu_memory_pct"] // 100,
                                   start=0, end=1) if held < 1000 else PlacementRequest(gpus=1, start=0, end=1)
        else:
            ask = (PlacementRequest(milli=held, start=0, end=1) if held < 1000
                   else PlacementRequest(gpus=1, start=0, end=1))
        decision = place(state, ask)
        if decision.ok:
            state = state.with_holdings(decision.holdings(reservation_id=k))
            granted += held
            placed += 1
        else:
            refused += 1
    return {"requests": placed + refused, "placed": placed, "refused": refused,
            "unallocated_pct": 100 * (capacity - granted) / capacity}


def timed_creates(mode: str, tasks: list[int], count: int, nodes: int, gpus_per_node: int, run: int = 1) -> float:
    """Creates per second of `count` creates into a fresh pool of `mode` (one whole GPU each for exclusive;
    for the others the stream's first requests, at most 70 % of the pool, so none is refused)."""
    from django.utils import timezone

    from allocations import services
    from common.errors import ApplicationError

    pool, team, user = make_pool(mode, nodes, gpus_per_node, f"timed-{mode.replace('_', '-')}-{run}")
    start = timezone.now() + timedelta(days=1)
    end = start + timedelta(hours=4)
    if mode == "exclusive":
        amounts = [{"gpus": 1}] * count
    else:
        amounts, asked = [], 0
        for amount, held in filter(None, (as_request(mode, m) for m in tasks)):
            if len(amounts) == count or asked + held > 0.7 * nodes * gpus_per_node * 1000:
                break
            amounts.append(amount)
            asked += held
    spent, made = 0.0, 0
    for amount in amounts:
        began = time.perf_counter()
        try:
            services.reservation_create(actor=user, request=services.ReservationRequest(
                team=team.slug, pool=pool.slug, starts_at=start, ends_at=end, **amount))
        except ApplicationError:
            continue  # a MIG profile the layout has run out of: only creates that book are timed
        spent += time.perf_counter() - began
        made += 1
    return made / spent


def over_grants() -> dict[str, int]:
    """From the database: pairs of grants holding one part of a card at one time, and instants at which a
    GPU's vGPU grants hold more memory or cores than it has (both must be 0)."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(
            """SELECT count(*) FROM allocations_allocation a JOIN allocations_allocation b
               ON a.gpu_id = b.gpu_id AND a.id < b.id AND a.mode <> 'vgpu' AND b.mode <> 'vgpu'
               AND a.starts_at < b.ends_at AND b.starts_at < a.ends_at AND a.ends_at > a.starts_at
               AND b.ends_at > b.starts_at AND a.share_from < b.share_to AND b.share_from < a.share_to""")
        (shared,) = cursor.fetchone()
        cursor.execute(
            """SELECT count(*) FROM (
                 SELECT a.id FROM allocations_allocation a JOIN allocations_allocation b
                   ON b.gpu_id = a.gpu_id AND b.mode = 'vgpu' AND b.starts_at <= a.starts_at
                   AND b.ends_at > a.starts_at
                 JOIN inventory_gpu g ON g.id = a.gpu_id
                 WHERE a.mode = 'vgpu' AND a.ends_at > a.starts_at
                 GROUP BY a.id, g.memory_mib
                 HAVING sum(b.memory_mib) > g.memory_mib OR sum(b.cores_pct) > 100) over""")
        (vgpu,) = cursor.fetchone()
    return {"share_overlaps": int(shared), "vgpu_overcommits": int(vgpu)}


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=8)
    parser.add_argument("--gpus-per-node", type=int, default=8)
    parser.add_argument("--timed", type=int, default=150, help="creates timed per path")
    parser.add_argument("--rounds", type=int, default=3, help="rounds of timed creates, the paths in turn")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    django_on_postgresql()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)
    clear_reservations()
    tasks = fractional_tasks()
    result: dict = {"pool_gpus": args.nodes * args.gpus_per_node, "trace_tasks": len(tasks), "modes": {}}
    print(f"{len(tasks)} fractional one-GPU tasks from gpushare40; pools of {args.nodes} x {args.gpus_per_node} "
          f"{MODEL}\n")
    print(f"{'mode':<14}{'service: unallocated':>22}{'engine alone':>14}{'loss (pp)':>11}{'placed':>9}")
    for mode in ("time_slicing", "mig", "mig_dynamic", "vgpu"):
        service = service_replay(mode, tasks, args.nodes, args.gpus_per_node)
        engine = engine_replay(mode, tasks, args.nodes, args.gpus_per_node)
        loss = service["unallocated_pct"] - engine["unallocated_pct"]
        result["modes"][mode] = {"service": service, "engine": engine, "loss_pp": loss}
        print(f"{mode:<14}{service['unallocated_pct']:>21.2f}%{engine['unallocated_pct']:>13.2f}%{loss:>11.2f}"
              f"{service['placed']:>5}/{service['requests']}")
    # Creates/s, each on a fresh pool, filled to at most 70 %: the whole-GPU path and the fractional ones
    # in turn, `--rounds` times, so a drift in the machine's speed touches them alike.
    print(f"\n{'create path':<14}{'creates/s':>11}{'cost vs whole-GPU':>20}   (per round)")
    whole_count = min(args.timed, int(0.7 * args.nodes * args.gpus_per_node))
    runs: dict[str, list[float]] = {"exclusive": [], "time_slicing": [], "mig": [], "mig_dynamic": [], "vgpu": []}
    for round_ in range(args.rounds):
        for mode in runs:
            count = whole_count if mode == "exclusive" else args.timed
            runs[mode].append(timed_creates(mode, tasks, count, args.nodes, args.gpus_per_node, run=round_))
    rates = {mode: sum(values) / len(values) for mode, values in runs.items()}
    baseline = rates["exclusive"]
    result["creates_per_s"] = rates
    result["creates_per_s_rounds"] = runs
    result["cost_ratio"] = {mode: baseline / rate for mode, rate in rates.items() if mode != "exclusive"}
    for mode, rate in rates.items():
        print(f"{mode:<14}{rate:>11.1f}{baseline / rate:>19.2f}x   ({', '.join(f'{v:.1f}' for v in runs[mode])})")
    result["database_check"] = over_grants()
    print(f"\ndatabase check: {result['database_check']}")
    clear_reservations()
    write_json(args.json, result)
    return result


if __name__ == "__main__":
    main()
