"""Waiting requests: in which order to try them, and backfilling without delaying the head.

Orderings (:data:`ORDERINGS`):

* ``fcfs``      – by submission time;
* ``sjf``       – shortest requested duration first (ties by submission);
* ``priority``  – highest priority first (ties by submission);
* ``fairshare`` – the team with the smallest *dominant share* first: for each team an
  exponentially decaying average of the resources it has held (GPU, CPU, memory), each as
  a fraction of the pool, the largest fraction being the dominant share (DRF), divided by
  the team's weight. Past usage fades with ``half_life``, so a team that ran big jobs
  yesterday yields to one that ran nothing, but not forever.

:func:`schedule` is one scheduling pass, EASY-backfill style: start requests in order
while they fit; when the first one (the *head*) does not, give it a reservation at the
earliest time it will fit (``reserve``) and let later requests start now only if they fit
**around that reservation** — the caller's ``try_start`` must honour it (with time
windows that is automatic: the reservation is a future holding, and a request whose
window overlaps it sees the capacity it takes). The head therefore never starts later
than it would have without backfill.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

ORDERINGS = ("fcfs", "sjf", "priority", "fairshare")


@dataclass
class QueuedItem:
    key: Hashable
    team: str
    submitted: float
    duration: float
    priority: int = 0
    resources: Mapping[str, float] = field(default_factory=dict)  # e.g. {"gpu": 2, "cpu": 16, "mem": 64}
    payload: Any = None  # the caller's request object


class FairShare:
    """Dominant-resource share per team over an exponentially decaying average of holdings.

    For team ``t`` and resource ``r`` the average follows ``dA/dt = (held(t) - A) / tau``
    with ``tau = half_life / ln 2``; it is integrated exactly between events (holdings
    only change at events). ``share(t) = max_r A_t[r] / capacity[r] / weight_t``.
    """

    def __init__(self, capacity: Mapping[str, float], half_life: float, weights: Mapping[str, float] | None = None):
        if half_life <= 0:
            raise ValueError("half_life must be positive")
        self.capacity = {r: float(c) for r, c in capacity.items() if c > 0}
        self.tau = half_life / math.log(2)
        self.weights = dict(weights or {})
        self._held: dict[str, dict[str, float]] = {}
        self._avg: dict[str, dict[str, float]] = {}
        self._t = -math.inf

    def advance(self, now: float) -> None:
        if now <= self._t:
            return
        if math.isfinite(self._t):
            keep = math.exp(-(now - self._t) / self.tau)
            for team, avg in self._avg.items():
                held = self._held.get(team, {})
                for r in self.capacity:
                    avg[r] = held.get(r, 0.0) + (avg.get(r, 0.0) - held.get(r, 0.0)) * keep
        self._t = now

    def _change(self, team: str, resources: Mapping[str, float], now: float, sign: float) -> None:
        self.advance(now)
        held = self._held.setdefault(team, {})
        self._avg.setdefault(team, {})
        for r, v in resources.items():
            held[r] = held.get(r, 0.0) + sign * float(v)

    def acquire(self, team: str, resources: Mapping[str, float], now: float) -> None:
        self._change(team, resources, now, +1.0)

    def release(self, team: str, resources: Mapping[str, float], now: float) -> None:
        self._change(team, resources, now, -1.0)

    def share(self, team: str, now: float) -> float:
        self.advance(now)
        avg = self._avg.get(team, {})
        dominant = max((avg.get(r, 0.0) / c for r, c in self.capacity.items()), default=0.0)
        return dominant / self.weights.get(team, 1.0)


def order_queue(
    items: Sequence[QueuedItem], ordering: str, *, now: float = 0.0, fairshare: FairShare | None = None
) -> list[QueuedItem]:
    """``items`` in the order they should be tried (stable: equal keys keep submission order)."""
    if ordering == "fcfs":
        return sorted(items, key=lambda i: i.submitted)
    if ordering == "sjf":
        return sorted(items, key=lambda i: (i.duration, i.submitted))
    if ordering == "priority":
        return sorted(items, key=lambda i: (-i.priority, i.submitted))
    if ordering == "fairshare":
        if fairshare is None:
            raise ValueError("fairshare ordering needs a FairShare")
        shares = {team: fairshare.share(team, now) for team in {i.team for i in items}}
        return sorted(items, key=lambda i: (shares[i.team], i.submitted))
    raise ValueError(f"unknown ordering {ordering!r}; choose one of {', '.join(ORDERINGS)}")


def schedule(
    items: Sequence[QueuedItem],
    ordering: str,
    now: float,
    try_start: Callable[[QueuedItem], Any | None],
    *,
    reserve: Callable[[QueuedItem], Any | None] | None = None,
    backfill: bool = True,
    backfill_depth: int = 100,
    fairshare: FairShare | None = None,
) -> list[tuple[QueuedItem, Any]]:
    """One pass over the queue; returns ``(item, handle)`` for every item started now.

    ``try_start(item)`` places the item now (returning a handle) or returns None;
    ``reserve(head)`` books the head's earliest future start so that later
    ``try_start`` calls cannot take what the head needs. Without ``backfill`` the pass
    stops at the first item that does not fit (strict order).
    """
    started: list[tuple[QueuedItem, Any]] = []
    head_blocked = False
    tried_after_head = 0
    for item in order_queue(items, ordering, now=now, fairshare=fairshare):
        if head_blocked:
            if tried_after_head >= backfill_depth:
                break
            tried_after_head += 1
        handle = try_start(item)
        if handle is not None:
            started.append((item, handle))
            if fairshare is not None:
                fairshare.acquire(item.team, item.resources, now)
            continue
        if head_blocked:
            continue
        if not backfill:
            break
        head_blocked = True
        if reserve is not None:
            reserve(item)
    return started
