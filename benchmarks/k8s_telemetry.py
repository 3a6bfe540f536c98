"""Kubernetes telemetry benchmark: `python -m benchmarks.k8s_telemetry --gpus 10000 --json FILE`.

A real Prometheus (Debian's package) scrapes the DCGM exporter stand-in (tests/kubernetes/dcgm_standin.py,
simulated GPUs: the one stand-in) for N GPUs on N/8 nodes, and the portal reads them every
`--period` seconds through the prometheus source (monitoring.kubernetes.cluster_telemetry_read: two
instant queries, then the one ingest: history, hot values, WebSocket groups). Reported per read cycle:
its wall time, the samples it stored, and the portal's CPU for it; beside it, in the same run and
process, the agent path's CPU for as many samples (monitoring.ingest.telemetry_ingest on request bodies
as `python -m agent` sends them, decode included; the HTTP server's share is left out of both, so the
comparison is of the ingest work alone). A WebSocket client on every pool (uvicorn, as production
serves sockets) times each message: sample → client (from the scrape that took the sample, what a
user's chart lags by) and read → client (from the start of the read cycle that carried it: the
portal's own part).

Needs DATABASE_URL (PostgreSQL), REDIS_URL and SECRET_KEY (see `make benchmark-k8s-telemetry`).
Everything runs on one machine: Prometheus, the stand-in and the client compete with the portal.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PREFIX = "bench-k8s"
GPUS_PER_NODE = 8


def _percentile(values: list[float], p: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, int(p / 100 * len(ordered)))], 1)


# --- children ----------------------------------------------------------------------------------

def serve_standin(gpus: int, targets: int, port_file: str) -> None:
    """Child: `targets` stand-in exporters sharing the GPUs (each node's GPUs on one of them)."""
    from tests.kubernetes.dcgm_standin import DcgmStandIn, SimGpu

    nodes = (gpus + GPUS_PER_NODE - 1) // GPUS_PER_NODE
    servers = [DcgmStandIn([]) for _ in range(targets)]
    for n in range(nodes):
        count = min(GPUS_PER_NODE, gpus - n * GPUS_PER_NODE)
        servers[n % targets].gpus.extend(
            SimGpu(_uuid(n, k), _node(n), k,
                   [(f"gpupool-{PREFIX}-team-{n % 10}", f"train-{n:05d}-{k}", "main")] if k % 2 == 0 else [])
            for k in range(count))
    for server in servers:
        server.start()
    Path(port_file).write_text(json.dumps([s.port for s in servers]))
    while True:
        time.sleep(3600)


def watch(base: str, token: str, pools: list[str], out: str, seconds: float) -> None:
    """Child: one WebSocket client per pool; writes (arrival, message t) of every telemetry message."""
    import asyncio

    import aiohttp

    rows: list[tuple[float, float]] = []

    async def client(session, pool):
        async with session.ws_connect(f"{base.replace('http', 'ws', 1)}/ws/pools/{pool}/",
                                      headers={"Authorization": f"Token {token}"}, max_msg_size=0) as ws:
            async for msg in ws:
                now = time.time()
                head = msg.data[:80]
                if head.startswith('{"type":"telemetry.samples"'):
                    rows.append((now, float(head.split('"t":', 1)[1].split(",", 1)[0])))

    async def run():
        async with aiohttp.ClientSession() as session:
            tasks = [asyncio.create_task(client(session, p)) for p in pools]
            await asyncio.sleep(seconds)
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    asyncio.run(run())
    Path(out).write_text(json.dumps(rows))


def _uuid(node: int, k: int) -> str:
    return f"GPU-{node:05d}{k:03d}-k8s0-4000-8000-bench{node:07d}"


def _node(n: int) -> str:
    return f"gpu-node-{n:05d}"


# --- the fleet ------------------------------------------------------------------------------------

def prepare(gpus: int, pools: int, prometheus_url: str):
    """The Kubernetes cluster (its GPUs as the stand-in reports them), a bare-metal twin of it for the
    agent path, `pools` pools on each, teams holding every other GPU, and a staff token."""
    from datetime import timedelta

    from django.contrib.auth import get_user_model
    from django.db import connection, transaction
    from django.utils import timezone

    from allocations.models import Allocation, Reservation
    from inventory import services
    from inventory.models import Cluster, Gpu, GpuPool, Node
    from monitoring.models import ClusterTelemetry, Sample
    from teams.models import Team
    from teams.services import api_token_create

    nodes = (gpus + GPUS_PER_NODE - 1) // GPUS_PER_NODE
    User = get_user_model()
    with transaction.atomic():
        staff, _ = User.objects.get_or_create(username=f"{PREFIX}-staff", defaults={"is_staff": True})
        Reservation.objects.filter(team__slug__startswith=f"{PREFIX}-").delete()
        Cluster.objects.filter(slug__startswith=PREFIX).delete()
        GpuPool.objects.filter(slug__startswith=PREFIX).delete()
        with connection.cursor() as cursor:
            cursor.execute(f"TRUNCATE {Sample._meta.db_table}")
        kube = Cluster.objects.create(name=PREFIX, slug=PREFIX, kind=Cluster.Kind.KUBERNETES,
                                      telemetry_source="prometheus", prometheus_url=prometheus_url)
        hosts = Cluster.objects.create(name=f"{PREFIX}-hosts", slug=f"{PREFIX}-hosts", kind=Cluster.Kind.BAREMETAL)
        kube_pools = [GpuPool.objects.create(slug=f"{PREFIX}-{j}", name=f"{PREFIX} {j}") for j in range(pools)]
        host_pools = [GpuPool.objects.create(slug=f"{PREFIX}-hosts-{j}", name=f"{PREFIX} hosts {j}")
                      for j in range(pools)]
        teams = [Team.objects.get_or_create(slug=f"{PREFIX}-team-{t}", defaults={"name": f"{PREFIX} team {t}"})[0]
                 for t in range(10)]
        agents = []
        now = timezone.now()
        for cluster, pool_list, prefix in ((kube, kube_pools, "GPU-"), (hosts, host_pools, "GPU-h")):
            node_rows = Node.objects.bulk_create(Node(cluster=cluster, name=_node(n)) for n in range(nodes))
            gpu_rows = Gpu.objects.bulk_create(
                Gpu(node=node, pool=pool_list[n % pools], index=k,
                    uuid=_uuid(n, k) if cluster is kube else _uuid(n, k).replace("GPU-", prefix, 1),
                    model_name="NVIDIA H100 80GB HBM3", memory_mib=81559)
                for n, node in enumerate(node_rows) for k in range(min(GPUS_PER_NODE, gpus - n * GPUS_PER_NODE)))
            # Every other GPU held by a team (its pods run there, as the stand-in's labels say).
            for n, node in enumerate(node_rows):
                team = teams[n % 10]
                held = [g for g in gpu_rows if g.node_id == node.pk and g.index % 2 == 0]
                if not held:
                    continue
                reservation = Reservation.objects.create(team=team, pool=held[0].pool, requested_by=staff,
                                                         gpus=len(held), starts_at=now - timedelta(minutes=5),
                                                         ends_at=now + timedelta(hours=2), state="active")
                Allocation.objects.bulk_create(Allocation(reservation=reservation, gpu=g, starts_at=reservation.starts_at,
                                                          ends_at=reservation.ends_at) for g in held)
            if cluster is hosts:
                for n, node in enumerate(node_rows):
                    _, key = services.host_token_create(actor=staff, cluster=hosts, host_name=node.name)
                    agents.append((key, [g.uuid for g in gpu_rows if g.node_id == node.pk]))
        ClusterTelemetry.objects.filter(cluster=kube).delete()
        _, token = api_token_create(user=staff, name="k8s-benchmark")
    return kube, agents, [p.slug for p in kube_pools], token


def agent_bodies(agents: list, t: float, seq: int) -> list[tuple[str, bytes]]:
    """Each host's request body as `python -m agent` sends it (agent/telemetry.py's shape)."""
    import orjson

    out = []
    for i, (key, uuids) in enumerate(agents):
        gpus = []
        for k, uuid in enumerate(uuids):
            u = (i * 7 + k * 13 + seq * 3) % 100
            gpus.append({"uuid": uuid, "utilization_gpu_pct": u, "utilization_memory_pct": u // 2,
                         "memory_used_mib": 800 * u, "memory_total_mib": 81559, "temperature_c": 35 + u // 2,
                         "power_w": 100.0 + 6 * u, "processes": [{"pid": 1000 + k, "used_memory_mib": 800 * u}]})
        out.append((key, orjson.dumps({"stream": f"bench-{i}", "batches": [{"seq": seq, "t": t, "gpus": gpus}]})))
    return out


# --- the run --------------------------------------------------------------------------------------

def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.k8s_telemetry", description=__doc__.split("\n\n")[0])
    parser.add_argument("--gpus", type=int, default=10000)
    parser.add_argument("--cycles", type=int, default=12, help="read cycles measured (after --warmup ones)")
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--period", type=float, default=5.0, help="seconds between reads (the source's default)")
    parser.add_argument("--scrape-interval", default="5s",
                        help="Prometheus's scrape interval (5s: every read finds every GPU's sample new, the most "
                             "work per read; real clusters scrape every 15-30 s)")
    parser.add_argument("--targets", type=int, default=25, help="stand-in exporter endpoints Prometheus scrapes")
    parser.add_argument("--pools", type=int, default=10)
    parser.add_argument("--json", metavar="FILE")
    parser.add_argument("--serve-standin", metavar="PORT_FILE", help=argparse.SUPPRESS)
    parser.add_argument("--watch", nargs=4, metavar=("BASE", "TOKEN", "POOLS", "OUT"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.serve_standin:
        serve_standin(args.gpus, args.targets, args.serve_standin)
        return 0
    for name in ("DATABASE_URL", "REDIS_URL", "SECRET_KEY"):
        if not os.environ.get(name):
            sys.exit(f"needs {name} (see `make benchmark-k8s-telemetry`)")
    if args.watch:
        base, token, pools, out = args.watch
        watch(base, token, pools.split(","), out, float(os.environ["BENCH_WATCH_SECONDS"]))
        return 0

    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
    os.environ.setdefault("LOG_LEVEL", "WARNING")
    os.environ["TELEMETRY_MAX_SAMPLES_PER_AGENT_MINUTE"] = "100000000"
    import django

    django.setup()
    import redis
    from django.conf import settings
    from django.core.management import call_command

    from tests.kubernetes.prometheus_server import PrometheusServer, free_port

    redis.Redis.from_url(settings.REDIS_URL).flushdb()
    call_command("migrate", verbosity=0)
    var_dir = Path(tempfile.mkdtemp(prefix="bench-k8s-telemetry-"))
    children: list[subprocess.Popen] = []
    prometheus = None
    try:
        port_file = var_dir / "standin-ports.json"
        children.append(subprocess.Popen([sys.executable, "-m", "benchmarks.k8s_telemetry", "--gpus", str(args.gpus),
                                          "--targets", str(args.targets), "--serve-standin", str(port_file)],
                                         cwd=ROOT, stdout=subprocess.DEVNULL))
        deadline = time.time() + 60
        while not port_file.exists():
            if time.time() > deadline or children[0].poll() is not None:
                sys.exit("the DCGM stand-in did not start")
            time.sleep(0.2)
        ports = json.loads(port_file.read_text())
        prometheus = PrometheusServer([f"127.0.0.1:{p}" for p in ports], scrape_interval=args.scrape_interval,
                                      directory=var_dir / "prometheus").start()
        kube, agents, pools, token = prepare(args.gpus, args.pools, prometheus.url)
        prometheus.wait_for_series("DCGM_FI_DEV_FB_USED", args.gpus, timeout=120)
        ws_port = free_port()
        ws_base = f"http://127.0.0.1:{ws_port}"
        with open(var_dir / "uvicorn.log", "wb") as log:
            children.append(subprocess.Popen(
                [sys.executable, "-m", "uvicorn", "config.asgi:application", "--host", "127.0.0.1", "--port",
                 str(ws_port), "--lifespan", "off", "--log-level", "warning", "--no-access-log"],
                cwd=ROOT, stdout=log, stderr=subprocess.STDOUT))
        import urllib.request

        deadline = time.time() + 60
        while True:
            try:
                urllib.request.urlopen(f"{ws_base}/healthz", timeout=1).read()
                break
            except OSError:
                if time.time() > deadline:
                    sys.exit("uvicorn did not start:\n" + (var_dir / "uvicorn.log").read_text()[-2000:])
                time.sleep(0.3)
        total_cycles = args.warmup + args.cycles
        watch_out = var_dir / "watch.json"
        children.append(subprocess.Popen(
            [sys.executable, "-m", "benchmarks.k8s_telemetry", "--watch", ws_base, token, ",".join(pools),
             str(watch_out)], cwd=ROOT, env=dict(os.environ, BENCH_WATCH_SECONDS=str(total_cycles * args.period + 8))))
        time.sleep(3)  # the client connects
        result = run_cycles(args, kube, agents, prometheus, total_cycles, standin_pid=children[0].pid)
        deadline = time.time() + total_cycles * args.period + 30
        while not watch_out.exists() and time.time() < deadline:
            time.sleep(0.5)
        arrivals = json.loads(watch_out.read_text()) if watch_out.exists() else []
    finally:
        for child in children:
            child.terminate()
        for child in children:
            try:
                child.wait(timeout=10)
            except subprocess.TimeoutExpired:
                child.kill()
        if prometheus is not None:
            prometheus.cleanup()
    report = summarize(args, result, arrivals)
    print_table(report)
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2))
    return 0


def _proc_cpu(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def run_cycles(args, kube, agents, prometheus, total: int, standin_pid: int) -> dict:
    from monitoring import ingest
    from monitoring.kubernetes import cluster_telemetry_read

    out = {"cycles": [], "agent": [], "cycle_starts": []}
    next_at = time.monotonic()
    for i in range(total):
        time.sleep(max(0.0, next_at - time.monotonic()))
        next_at += args.period
        measured = i >= args.warmup
        prom0, standin0 = _proc_cpu(prometheus.process.pid), _proc_cpu(standin_pid)
        started, cpu0 = time.time(), time.process_time()
        status = cluster_telemetry_read(cluster=kube)
        cpu, wall = time.process_time() - cpu0, time.time() - started
        if status.error:
            sys.exit(f"read failed: {status.error}")
        if measured:
            out["cycle_starts"].append(started)
            out["cycles"].append({"wall_s": round(wall, 3), "cpu_s": round(cpu, 3), "samples": status.samples_ingested,
                                  "series": status.series_read, "gpus": status.gpus_read,
                                  "prometheus_cpu_s": round(_proc_cpu(prometheus.process.pid) - prom0, 3),
                                  "standin_cpu_s": round(_proc_cpu(standin_pid) - standin0, 3),
                                  "lag_s": status.lag_seconds, **getattr(status, "stages", {})})
        # Beside it, the agent path: the same number of GPUs, as 1,250 hosts' requests of 8 GPUs.
        from inventory.models import HostToken

        bodies = agent_bodies(agents, time.time(), i + 1)
        tokens = {t.host_name: t for t in HostToken.objects.filter(cluster__slug=f"{PREFIX}-hosts")
                  .select_related("cluster")}
        by_key = {}
        from common.secrets import key_digest

        for t in tokens.values():
            by_key[t.key_hash] = t
        resolved = [(by_key[key_digest(key)], body) for key, body in bodies]
        cpu0 = time.process_time()
        accepted = 0
        for token, body in resolved:
            accepted += ingest.telemetry_ingest(token=token, payload=ingest.decode_body(body)).accepted
        if measured:
            out["agent"].append({"cpu_s": round(time.process_time() - cpu0, 3), "samples": accepted})
    return out


def summarize(args, result: dict, arrivals: list) -> dict:
    cycles, agent = result["cycles"], result["agent"]
    k8s_samples = sum(c["samples"] for c in cycles)
    k8s_cpu = sum(c["cpu_s"] for c in cycles)
    agent_samples = sum(a["samples"] for a in agent)
    agent_cpu = sum(a["cpu_s"] for a in agent)
    starts = result["cycle_starts"]
    first, last = (starts[0], starts[-1] + args.period) if starts else (0, 0)
    sample_to_client = [(at - t) * 1000 for at, t in arrivals if first <= at <= last and t > 1e9]
    read_to_client = []
    for at, t in arrivals:
        if not first <= at <= last:
            continue
        cycle = max((s for s in starts if s <= at), default=None)
        # A message of the agent path's pools would not be here: the client watches the Kubernetes pools only.
        if cycle is not None:
            read_to_client.append((at - cycle) * 1000)
    walls = [c["wall_s"] for c in cycles]
    k8s_per_1000 = 1000 * k8s_cpu / max(1, k8s_samples) * 1000
    agent_per_1000 = 1000 * agent_cpu / max(1, agent_samples) * 1000
    return {
        "gpus": args.gpus, "nodes": (args.gpus + GPUS_PER_NODE - 1) // GPUS_PER_NODE, "period_s": args.period,
        "scrape_interval": args.scrape_interval, "cycles": len(cycles), "cpu_count": os.cpu_count(),
        "read_cycle_s_p50": round(statistics.median(walls), 3) if walls else None,
        "read_cycle_s_max": max(walls) if walls else None,
        "samples_per_cycle_p50": statistics.median(c["samples"] for c in cycles) if cycles else 0,
        "series_per_cycle": cycles[-1]["series"] if cycles else 0,
        "k8s_cpu_ms_per_1000_samples": round(k8s_per_1000, 1),
        "agent_cpu_ms_per_1000_samples": round(agent_per_1000, 1),
        "k8s_vs_agent_cpu": round(k8s_per_1000 / agent_per_1000, 2) if agent_per_1000 else None,
        **{f"{stage}_p50": statistics.median(c.get(stage, 0) for c in cycles) if cycles else None
           for stage in ("read_s", "map_s", "ingest_s")},
        "prometheus_cpu_s_per_cycle_p50": statistics.median(c["prometheus_cpu_s"] for c in cycles) if cycles else None,
        "standin_cpu_s_per_cycle_p50": statistics.median(c["standin_cpu_s"] for c in cycles) if cycles else None,
        "loadavg_at_end": os.getloadavg()[0],
        "sample_to_client_ms_p50": _percentile(sample_to_client, 50),
        "sample_to_client_ms_p95": _percentile(sample_to_client, 95),
        "read_to_client_ms_p50": _percentile(read_to_client, 50),
        "read_to_client_ms_p95": _percentile(read_to_client, 95),
        "messages": len(sample_to_client),
        "details": {"cycles": cycles, "agent": agent},
    }


def print_table(r: dict) -> None:
    print(f"Kubernetes telemetry via Prometheus: {r['gpus']} GPUs on {r['nodes']} nodes, read every {r['period_s']:g} s "
          f"(scrape {r['scrape_interval']}), {r['cycles']} cycles, {r['cpu_count']} cores")
    rows = [
        ("read cycle, p50 / max (s)", f"{r['read_cycle_s_p50']} / {r['read_cycle_s_max']}"),
        ("  of which: queries / mapping / ingest (s, p50)", f"{r['read_s_p50']} / {r['map_s_p50']} / {r['ingest_s_p50']}"),
        ("samples stored per cycle (p50)", r["samples_per_cycle_p50"]),
        ("series read per cycle", r["series_per_cycle"]),
        ("portal CPU per 1000 samples, Kubernetes (ms)", r["k8s_cpu_ms_per_1000_samples"]),
        ("portal CPU per 1000 samples, agent ingest (ms)", r["agent_cpu_ms_per_1000_samples"]),
        ("Kubernetes / agent CPU", r["k8s_vs_agent_cpu"]),
        ("Prometheus CPU per cycle, p50 (s)", r["prometheus_cpu_s_per_cycle_p50"]),
        ("DCGM stand-in CPU per cycle, p50 (s)", r["standin_cpu_s_per_cycle_p50"]),
        ("load average at the end (1 min)", round(r["loadavg_at_end"], 2)),
        ("sample -> WebSocket client p50 / p95 (ms)", f"{r['sample_to_client_ms_p50']} / {r['sample_to_client_ms_p95']}"),
        ("read start -> WebSocket client p50 / p95 (ms)", f"{r['read_to_client_ms_p50']} / {r['read_to_client_ms_p95']}"),
        ("messages timed", r["messages"]),
    ]
    for name, value in rows:
        print(f"  {name:<48}{value}")


if __name__ == "__main__":
    sys.exit(main())
