"""``--replay-time``: tasks arrive at their creation time, hold resources until their deletion time,
and wait in a queue when nothing fits. Measures queueing delay per policy and queue ordering.

The trace's own times put only ~37 GPUs (peak 66) of work on the 1,213 nodes at once
(the 8,152 pods are a sample of a much larger cluster), so nothing would ever wait. Two
knobs create contention without changing the workload's mix: ``--speedup F`` divides
arrival times by F (durations unchanged) and ``--replay-nodes N`` replays on N nodes drawn
from the node list (every model kept in proportion). Defaults: 30x on 50 nodes (~250
GPUs): over the busy 90% of arrivals the offered load averages ~218 GPUs and its 90th
percentile ~315, so the pool is contended without being hopelessly overloaded.

Scheduling happens at every arrival and departure (:func:`allocations.placement.queueing.schedule`):
requests start in queue order while they fit; the first that does not gets a reservation
at the earliest time it will fit (found by releasing running tasks in end order), and
later requests backfill only if they fit without touching it. Teams for fair share are the
trace's QoS classes (LS, BE, Burstable, Guaranteed), which also give the priorities.
Tasks that fit nowhere even on the empty pool are rejected at arrival.
"""

from __future__ import annotations

import argparse
import heapq
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from allocations.placement.arrays import ClusterArrays
from allocations.placement.engine import Choice, Placer, decide
from allocations.placement.feasibility import feasible_nodes
from allocations.placement.policies import get_policy
from allocations.placement.policies.base import PolicyContext
from allocations.placement.queueing import FairShare, QueuedItem, schedule
from allocations.placement.requests import Demand
from allocations.placement.workload import WorkloadProfile

from .placement_trace import DEFAULT_NODES, Trace, load_nodes, load_trace

PRIORITY = {"Guaranteed": 3, "LS": 2, "Burstable": 1, "BE": 0}
DEFAULT_POLICIES = ("first_fit", "best_fit", "fgd", "portal")
FAIRSHARE_HALF_LIFE_S = 3600.0


@dataclass
class Running:
    item: QueuedItem
    demand: Demand
    choice: Choice
    end: float


def subsample_nodes(template: ClusterArrays, n: int, seed: int) -> ClusterArrays:
    """``n`` nodes of ``template``, each model represented in proportion (at least one node)."""
    rng = np.random.default_rng(seed)
    models = template.model_idx
    picks: list[int] = []
    uniq, counts = np.unique(models, return_counts=True)
    quota = np.maximum(1, np.round(counts / counts.sum() * n)).astype(int)
    for m, q in zip(uniq, quota, strict=True):
        pool = np.flatnonzero(models == m)
        picks.extend(rng.choice(pool, size=min(q, len(pool)), replace=False).tolist())
    picks = sorted(picks)
    mlist = [[template.models[int(x)] for x in template.gpu_model[i, : template.gpu_count[i]]] for i in picks]
    return ClusterArrays.build(
        node_ids=[template.node_ids[i] for i in picks],
        cpu_milli=template.cpu_cap[picks],
        memory_mib=template.mem_cap[picks],
        gpu_models=mlist,
        gpu_memory_mib=[list(template.gpu_mem_total[i, : template.gpu_count[i]]) for i in picks],
    )


class TimeReplay:
    def __init__(
        self,
        nodes: ClusterArrays,
        trace: Trace,
        policy: str,
        ordering: str,
        backfill: bool,
        profile: WorkloadProfile,
        speedup: float,
        seed: int = 42,
    ) -> None:
        assert trace.creation is not None and trace.deletion is not None
        self.trace = trace
        arrays = nodes.copy()
        arrays.tie_rank = np.random.default_rng(seed).permutation(arrays.n_nodes).astype(np.int64)
        self.placer = Placer(
            arrays, get_policy(policy), PolicyContext(rng=np.random.default_rng(seed), profile=profile)
        )
        self.empty = nodes.copy()
        self.ordering, self.backfill, self.speedup = ordering, backfill, speedup
        cap = {
            "gpu": nodes.gpu_capacity_milli() / 1000.0,
            "cpu": float(nodes.cpu_cap.sum()) / 1000.0,
            "mem": float(nodes.mem_cap.sum()) / 1024.0,
        }
        self.fairshare = FairShare(cap, half_life=FAIRSHARE_HALF_LIFE_S / speedup)
        self.running: list[tuple[float, int, Running]] = []  # heap by end time
        self.queue: list[QueuedItem] = []
        # The queue head's reservation: (start time, the pool at that time with the head placed).
        self.reservation: tuple[float, ClusterArrays] | None = None
        self.delays: list[float] = []
        self.delay_teams: list[str] = []
        self.latency: list[float] = []
        self.rejected = 0
        self.busy_gpu_seconds = 0.0
        self._last_t = 0.0
        self.busy = (0.0, 0.0)
        self._seq = 0

    # ------------------------------------------------------------------ scheduling hooks
    def _decide(self, demand: Demand) -> Choice | None:
        t0 = time.perf_counter()
        choice = decide(self.placer.arrays, demand, self.placer.policy, self.placer.ctx, cache=self.placer.cache)
        self.latency.append(time.perf_counter() - t0)
        return choice

    def try_start(self, item: QueuedItem, now: float) -> Running | None:
        demand: Demand = item.payload
        arrays = self.placer.arrays
        res = self.reservation
        # A request still running when the head's reservation starts must fit both now and
        # in the pool as it will be then, head included: decide on what is free in both.
        clash = res is not None and now + item.duration > res[0]
        if clash:
            assert res is not None
            t0 = time.perf_counter()
            choice = decide(arrays.intersect(res[1]), demand, self.placer.policy, self.placer.ctx)
            self.latency.append(time.perf_counter() - t0)
        else:
            choice = self._decide(demand)
        if choice is None:
            return None
        arrays.apply(choice.node, demand, choice.slots, choice.mig_start)
        if clash:
            assert res is not None
            res[1].apply(choice.node, demand, choice.slots, choice.mig_start)
        run = Running(item, demand, choice, now + item.duration)
        heapq.heappush(self.running, (run.end, self._seq, run))
        self._seq += 1
        self.delays.append(now - item.submitted)
        self.delay_teams.append(item.team)
        return run

    def reserve(self, head: QueuedItem, now: float) -> None:
        """Earliest start of the head: release running tasks in end order on a copy until it fits."""
        demand: Demand = head.payload
        probe = self.placer.arrays.copy()
        ending = sorted(self.running, key=lambda x: (x[0], x[1]))
        for k, (end, _, run) in enumerate(ending):
            probe.release(run.choice.node, run.demand, run.choice.slots, run.choice.mig_start)
            if k + 1 < len(ending) and ending[k + 1][0] == end:
                continue  # release everything that ends at the same moment first
            if feasible_nodes(probe, demand)[0].size:
                choice = decide(probe, demand, self.placer.policy, self.placer.ctx)
                if choice is not None:
                    probe.apply(choice.node, demand, choice.slots, choice.mig_start)
                    self.reservation = (end, probe)
                    return
        self.reservation = None

    # ------------------------------------------------------------------ event loop
    def _account(self, now: float) -> None:
        """GPU-seconds in use, counted over the busy window (5th to 95th percentile of arrivals)."""
        lo, hi = max(self._last_t, self.busy[0]), min(now, self.busy[1])
        if hi > lo:
            used = self.placer.arrays.gpu_capacity_milli() - int(self.placer.arrays.gpu_free.sum())
            self.busy_gpu_seconds += used / 1000.0 * (hi - lo)
        self._last_t = now

    def _pass(self, now: float) -> None:
        if not self.queue:
            return
        self.reservation = None
        started = schedule(
            self.queue,
            self.ordering,
            now,
            lambda it: self.try_start(it, now),
            reserve=lambda it: self.reserve(it, now),
            backfill=self.backfill,
            fairshare=self.fairshare,
        )
        if started:
            done = {id(item) for item, _ in started}
            self.queue = [q for q in self.queue if id(q) not in done]
        self.reservation = None

    def _depart_until(self, t: float) -> None:
        while self.running and self.running[0][0] <= t:
            end = self.running[0][0]
            while self.running and self.running[0][0] == end:
                _, _, run = heapq.heappop(self.running)
                self._account(end)
                self.placer.release(run.choice, run.demand)
                self.fairshare.release(run.item.team, run.item.resources, end)
            self._pass(end)

    def run(self) -> dict:
        trace = self.trace
        assert trace.creation is not None and trace.deletion is not None
        creation: np.ndarray = trace.creation / self.speedup
        duration: np.ndarray = np.maximum(trace.deletion - trace.creation, 1.0)
        order = np.argsort(creation, kind="stable")
        self._last_t = float(creation[order[0]])
        self.busy = (float(np.percentile(creation, 5)), float(np.percentile(creation, 95)))
        start_wall = time.perf_counter()
        k = 0
        while k < len(order):
            t = float(creation[order[k]])
            self._depart_until(t)
            self._account(t)
            while k < len(order) and float(creation[order[k]]) == t:
                i = int(order[k])
                k += 1
                demand = trace.demand(i)
                if feasible_nodes(self.empty, demand)[0].size == 0:
                    self.rejected += 1
                    continue
                qos = trace.qos[i] or "LS"
                self.queue.append(
                    QueuedItem(
                        key=i,
                        team=qos,
                        submitted=t,
                        duration=float(duration[i]),
                        priority=PRIORITY.get(qos, 0),
                        resources={
                            "gpu": demand.total_milli / 1000.0,
                            "cpu": demand.cpu_milli / 1000.0,
                            "mem": demand.memory_mib / 1024.0,
                        },
                        payload=demand,
                    )
                )
            self._pass(t)
        while self.running or self.queue:
            if not self.running:  # should not happen: queued work fits an empty pool
                break
            self._depart_until(self.running[0][0])
        delays = np.asarray(self.delays)
        waited = delays[delays > 0]
        horizon = max(self.busy[1] - self.busy[0], 1e-9)
        return {
            "tasks": int(len(order)),
            "started": int(len(delays)),
            "rejected_never_fit": self.rejected,
            "never_started": int(len(self.queue)),
            "mean_delay_s": float(delays.mean()) if delays.size else 0.0,
            "p50_delay_s": float(np.percentile(delays, 50)) if delays.size else 0.0,
            "p95_delay_s": float(np.percentile(delays, 95)) if delays.size else 0.0,
            "max_delay_s": float(delays.max()) if delays.size else 0.0,
            "waited_pct": 100.0 * waited.size / max(delays.size, 1),
            "mean_delay_by_team_s": {
                team: float(delays[[t == team for t in self.delay_teams]].mean())
                for team in sorted(set(self.delay_teams))
            },
            "gpu_utilisation_pct_busy": 100.0
            * self.busy_gpu_seconds
            / (self.placer.arrays.gpu_capacity_milli() / 1000.0)
            / horizon,
            "decisions": len(self.latency),
            "latency_ms_p50": float(np.percentile(self.latency, 50) * 1000) if self.latency else 0.0,
            "latency_ms_p99": float(np.percentile(self.latency, 99) * 1000) if self.latency else 0.0,
            "wall_s": time.perf_counter() - start_wall,
        }


def run_time_replay(args: argparse.Namespace, policies: list[str], seeds: list[int]) -> dict:
    from .placement import resolve_trace  # local import: avoids a cycle at module load

    trace_path = resolve_trace(args.trace)
    trace = load_trace(trace_path)
    if trace.creation is None:
        raise SystemExit(f"{trace_path.name} has no creation/deletion times; --replay-time needs them")
    nodes_path = Path(args.nodes) if args.nodes else DEFAULT_NODES
    nodes = load_nodes(nodes_path)
    if getattr(args, "replay_nodes", 0):
        nodes = subsample_nodes(nodes, args.replay_nodes, seeds[0])
    profile = WorkloadProfile.from_demands(trace.demand(i) for i in range(len(trace)))
    speedup = args.speedup
    orderings = [o.strip() for o in args.orderings.split(",") if o.strip()]
    print(
        f"time replay of {trace_path.name} on {nodes.n_nodes} nodes ({nodes.gpu_capacity_milli() // 1000} GPUs), "
        f"arrivals sped up {speedup:.1f}x; backfill on (plus fcfs without backfill)",
        flush=True,
    )
    print(
        f"{'policy':10s} {'ordering':14s} {'mean wait s':>11s} {'p50':>8s} {'p95':>9s} {'max':>9s} "
        f"{'waited %':>8s} {'GPU util %':>10s} {'p99 ms':>7s}",
        flush=True,
    )
    out: dict = {
        "trace": str(trace_path),
        "nodes": str(nodes_path),
        "pool_nodes": nodes.n_nodes,
        "speedup": speedup,
        "seed": seeds[0],
        "results": {},
    }
    for policy in policies:
        out["results"][policy] = {}
        for ordering, backfill in [("fcfs", False)] + [(o, True) for o in orderings]:
            label = ordering + ("+backfill" if backfill else "")
            res = TimeReplay(nodes, trace, policy, ordering, backfill, profile, speedup, seed=seeds[0]).run()
            out["results"][policy][label] = res
            print(
                f"{policy:10s} {label:14s} {res['mean_delay_s']:11.1f} {res['p50_delay_s']:8.1f} "
                f"{res['p95_delay_s']:9.1f} {res['max_delay_s']:9.1f} {res['waited_pct']:8.1f} "
                f"{res['gpu_utilisation_pct_busy']:10.1f} {res['latency_ms_p99']:7.2f}",
                flush=True,
            )
    return out
