"""Filter, score, pick: the one decision procedure behind the portal API and the benchmark.

``decide`` runs on a :class:`ClusterArrays` (free capacity for one window):

1. filter: :func:`feasibility.feasible_nodes` (health, labels, CPU, memory, GPU fit; only
   the rows whose version moved, through a :class:`ScoreCache` when the caller keeps one);
2. score: the policy's ``evaluate`` on the feasible nodes (through a :class:`ScoreCache`
   when the caller keeps one and the policy is ``node_local``), then its ``adjust`` (a
   cluster-wide correction, never cached);
3. pick: the highest score; equal scores go to the lowest ``tie_rank`` (the cluster's
   fixed node order);
4. GPUs: the policy's ``choose_gpus`` on the chosen node.

:class:`Placer` keeps arrays, policy and cache together for callers that place many
demands in a row against evolving state (the benchmark, batch admission).
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass, field

import numpy as np

from .arrays import ClusterArrays
from .feasibility import feasible_nodes, gpu_fit, node_resources_ok
from .policies.base import Policy, PolicyContext
from .requests import Demand


@dataclass(frozen=True)
class Choice:
    node: int  # index into the arrays
    slots: tuple[int, ...]  # GPU slots on that node
    mig_start: int | None
    score: float
    candidates: int  # feasible nodes considered


@functools.lru_cache(maxsize=4096)
def _memory_set_aside(demand: Demand) -> Demand:
    """The demand with host memory 0 (ScoreCache.key's, once per demand: a lookup is on every decision's path)."""
    return dataclasses.replace(demand, memory_mib=0)


class ScoreCache:
    """Per demand (:meth:`key`), the last score of every node and the row version it was computed at.

    Valid only for ``node_local`` policies: a node's score is recomputed when its row's
    version moved, so a placement costs one row re-score per shape later asked about.
    It keeps each demand's feasible nodes the same way (:meth:`feasible`), for any policy.
    Where a demand differs from one already scored only in host memory, it takes that
    sibling's scores of the rows host memory does not change (:meth:`_from_sibling`).
    """

    def __init__(self, n_nodes: int) -> None:
        self.n = n_nodes
        self._entries: dict[tuple, tuple[np.ndarray, np.ndarray, np.ndarray]] = {}
        self._feasible: dict[Demand, tuple[np.ndarray, np.ndarray, np.ndarray]] = {}
        #: Per demand with host memory set aside, the keys of its entries (policies with ``sibling_rows`` only).
        self._siblings: dict[Demand, list[Demand]] = {}
        self.evaluated_rows = 0  # statistics: rows actually scored
        self.copied_rows = 0  # statistics: rows taken from a sibling's entry instead
        self._arrays: ClusterArrays | None = None  # the one arrays object the entries are for (:meth:`_for`)

    def _for(self, arrays: ClusterArrays) -> None:
        """Forget every entry when asked about another arrays object than the last. Versions count the changes of
        one object's rows: a copy starts from the same numbers and goes its own way (``intersect`` gives rows of two
        moments under the first one's versions), so an entry's versions say nothing about another object's rows."""
        if arrays is not self._arrays:
            self._entries.clear()
            self._feasible.clear()
            self._siblings.clear()
            self._arrays = arrays

    def feasible(
        self, arrays: ClusterArrays, demand: Demand, label_mask: np.ndarray | None = None
    ) -> tuple[np.ndarray, np.ndarray]:
        """:func:`feasible_nodes`' answer, checking again only the rows whose version moved since this
        demand's last call: whether a node can take a demand depends on its row alone (the labels, which
        are not in the arrays, are applied after). Over a thousand nodes the filter cost more than
        re-scoring the one or two rows that changed between two placements."""
        self._for(arrays)
        entry = self._feasible.get(demand)
        if entry is None:
            entry = self._feasible[demand] = (
                np.zeros(self.n, dtype=bool),
                np.zeros((self.n, arrays.max_gpus), dtype=bool),
                np.full(self.n, -1, dtype=np.int64),
            )
        ok, fit, versions = entry
        stale = np.flatnonzero(versions != arrays.version)
        if stale.size:
            # Every row (a new demand): by slices, which read the arrays in place, rather than gathers.
            rows = slice(None) if stale.size == self.n else stale
            rows_fit = gpu_fit(arrays, demand, rows)  # all False for CPU-only work, which needs no GPU
            ok[rows] = node_resources_ok(arrays, demand, rows) & (rows_fit.sum(axis=1) >= demand.num_gpu)
            fit[rows] = rows_fit
            versions[rows] = arrays.version[rows]
        idx = np.flatnonzero(ok & label_mask if label_mask is not None else ok)
        return idx, fit[idx]

    @staticmethod
    def key(demand: Demand, reads_memory: bool = True) -> Demand:
        """What one entry's scores are for: the demand itself, every field of it (its size, and its constraints,
        which decide the GPU fit a policy is given); its host memory set aside for a policy that never reads it
        (:attr:`Policy.reads_memory`), so that demands differing only there share one entry. (A key listing fields
        by hand once left host memory out, and two demands shared scores only one of them had.)"""
        return demand if reads_memory else _memory_set_aside(demand)

    def lookup(
        self,
        arrays: ClusterArrays,
        demand: Demand,
        idx: np.ndarray,
        fit: np.ndarray,
        policy: Policy,
        ctx: PolicyContext,
    ) -> tuple[np.ndarray, np.ndarray | None]:
        self._for(arrays)
        key = self.key(demand, policy.reads_memory)
        entry = self._entries.get(key)
        if entry is None:
            entry = (
                np.zeros(self.n, dtype=np.float64),
                np.full(self.n, -1, dtype=np.int64),
                np.full(self.n, -1, dtype=np.int64),
            )
            self._entries[key] = entry
            if policy.sibling_rows:
                self._siblings.setdefault(_memory_set_aside(demand), []).append(key)
        scores, slots, versions = entry
        stale = np.flatnonzero(versions[idx] != arrays.version[idx])
        if policy.sibling_rows and stale.size >= policy.sibling_rows:
            stale = self._from_sibling(arrays, demand, key, idx, stale, policy, ctx)
        if stale.size:
            rows = idx[stale]
            ev = policy.evaluate(arrays, demand, rows, fit[stale], ctx)
            scores[rows] = ev.scores
            slots[rows] = ev.slots if ev.slots is not None else -1
            versions[rows] = arrays.version[rows]
            self.evaluated_rows += int(stale.size)
        return scores[idx], slots[idx]

    def _from_sibling(
        self,
        arrays: ClusterArrays,
        demand: Demand,
        key: Demand,
        idx: np.ndarray,
        stale: np.ndarray,
        policy: Policy,
        ctx: PolicyContext,
    ) -> np.ndarray:
        """Copy into ``key``'s entry the stale rows a sibling (the same demand with another host memory) has
        scored in their present state and whose score host memory does not change (:meth:`Policy.memory_changes`);
        returns the positions in ``idx`` still to score.

        The key holds host memory (a policy may read it), so a demand with a host memory the cache has not seen
        for its size and constraints would score every feasible node: the slowest decisions (portal on default
        seed 42: 60 of its 151 full scorings, ~1,000 rows each), and an entry asked rarely re-scores many rows.
        The sibling most up to date for those rows (usually the last asked) has scored nearly all of them in their
        present state, and portal's one memory-dependent term, its stranding, moves on few nodes (most have
        memory to spare either way), so only those few are scored. A sibling's score of a row at its version was
        computed with the same GPU fit (:func:`gpu_fit` reads no host memory) and the same policy and context
        (one per cache)."""
        siblings = self._siblings.get(_memory_set_aside(demand), ())
        rows = idx[stale]
        now = arrays.version[rows]
        best, current, most = None, None, 0
        for other in siblings:
            if other == key:
                continue
            at_version = self._entries[other][2][rows] == now
            count = int(np.count_nonzero(at_version))
            if count > most:
                best, current, most = other, at_version, count
        if best is None:
            return stale
        differs = policy.memory_changes(arrays, demand, best, rows, ctx)
        if differs is None:
            return stale
        take = current & ~differs
        copied = rows[take]
        scores, slots, versions = self._entries[key]
        other_scores, other_slots, _ = self._entries[best]
        scores[copied] = other_scores[copied]
        slots[copied] = other_slots[copied]
        versions[copied] = now[take]
        self.copied_rows += int(copied.size)
        return stale[~take]


def pick_best(scores: np.ndarray, tie_rank: np.ndarray) -> int:
    """Position of the highest score; among equal scores the lowest tie rank."""
    top = scores.max()
    best = np.flatnonzero(scores == top)
    if best.size == 1:
        return int(best[0])
    return int(best[np.argmin(tie_rank[best])])


def decide(
    arrays: ClusterArrays,
    demand: Demand,
    policy: Policy,
    ctx: PolicyContext,
    *,
    label_mask: np.ndarray | None = None,
    cache: ScoreCache | None = None,
) -> Choice | None:
    """The node and GPUs ``policy`` gives ``demand`` now, or None if no node is feasible."""
    if cache is not None:
        idx, fit = cache.feasible(arrays, demand, label_mask)
    else:
        idx, fit = feasible_nodes(arrays, demand, label_mask)
    if idx.size == 0:
        return None
    if cache is not None and policy.node_local:
        scores, slots = cache.lookup(arrays, demand, idx, fit, policy, ctx)
    else:
        ev = policy.evaluate(arrays, demand, idx, fit, ctx)
        scores, slots = ev.scores, ev.slots
    scores = policy.adjust(arrays, demand, idx, scores, ctx)
    pos = pick_best(scores, arrays.tie_rank[idx])
    node = int(idx[pos])
    hint = int(slots[pos]) if slots is not None else -1
    gpus, mig_start = policy.choose_gpus(arrays, demand, node, fit[pos], hint, ctx)
    return Choice(node=node, slots=tuple(gpus), mig_start=mig_start, score=float(scores[pos]), candidates=int(idx.size))


@dataclass
class Placer:
    """Arrays + policy + cache: place demands one after another, updating the arrays."""

    arrays: ClusterArrays
    policy: Policy
    ctx: PolicyContext = field(default_factory=PolicyContext)
    use_cache: bool = True
    cache: ScoreCache = field(init=False)

    def __post_init__(self) -> None:
        self.cache = ScoreCache(self.arrays.n_nodes)

    def place(self, demand: Demand, label_mask: np.ndarray | None = None) -> Choice | None:
        choice = decide(
            self.arrays,
            demand,
            self.policy,
            self.ctx,
            label_mask=label_mask,
            cache=self.cache if self.use_cache else None,
        )
        if choice is not None:
            self.arrays.apply(choice.node, demand, choice.slots, choice.mig_start)
        return choice

    def release(self, choice: Choice, demand: Demand) -> None:
        self.arrays.release(choice.node, demand, choice.slots, choice.mig_start)
