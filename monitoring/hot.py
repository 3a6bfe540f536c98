"""The latest sample of every GPU, kept hot in the cache (Redis in production, local memory embedded).

One key per node (`tm:node:<id>` → {gpu id: values}), written with one `set` per agent
batch (an agent reports all its GPUs at once) and read with one `get_many` for a page, a
scrape or an alert evaluation: nothing here touches the database. A GPU whose agent stopped reporting drops out after LATEST_TTL seconds.
"""
from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass

from django.core.cache import cache

# A sample older than this is "no data" (the GPU's agent stopped reporting).
LATEST_TTL = 120
# Keys live longer than that (they share one write with the agent's stream position);
# readers drop stale values by their timestamp.
STORE_TTL = 7 * 86400


@dataclass(frozen=True)
class Latest:
    ts: float
    util: int
    mem_util: int
    mem_used: int
    mem_total: int
    temp: int
    power: float
    processes: tuple[tuple[int, int], ...] = ()

    @property
    def mem_pct(self) -> float:
        return 100.0 * self.mem_used / self.mem_total if self.mem_total else 0.0

    def as_payload(self) -> dict:
        return {"t": self.ts, "util": self.util, "mem_util": self.mem_util, "mem_used": self.mem_used,
                "mem_total": self.mem_total, "temp": self.temp, "power": self.power}


def _key(node_id: int) -> str:
    return f"tm:node:{node_id}"


def latest_entries(node_id: int, values: dict[int, Latest]) -> dict:
    """The cache entry holding the newest sample of each GPU of one node (one agent batch carries them all)."""
    return {_key(node_id): {gpu_id: tuple(v.__dict__.values()) for gpu_id, v in values.items()}} if values else {}


def latest_set(node_id: int, values: dict[int, Latest]) -> None:
    cache.set_many(latest_entries(node_id, values), STORE_TTL)


def latest_get(gpus: Iterable[tuple[int, int]]) -> dict[int, Latest]:
    """(gpu id, node id) pairs → the latest sample of each GPU that has one (one cache read for them all)."""
    pairs = list(gpus)
    found = cache.get_many({_key(node_id) for _, node_id in pairs})
    fresh_after = time.time() - LATEST_TTL
    out = {}
    for gpu_id, node_id in pairs:
        raw = found.get(_key(node_id), {}).get(gpu_id)
        if raw is not None and raw[0] >= fresh_after:
            out[gpu_id] = Latest(*raw)
    return out


# --- counters of the ingest (accepted, and rejected or clamped by reason) -------------------

COUNTER_PREFIX = "tm:count:"


def count(reasons: dict[str, int]) -> None:
    """Add to the shared counters (cache-wide, so every web replica reports the same totals)."""
    for reason, n in reasons.items():
        if not n:
            continue
        key = COUNTER_PREFIX + reason
        try:
            cache.incr(key, n)
        except ValueError:
            if not cache.add(key, n, timeout=None):
                cache.incr(key, n)


def counters(reasons: Iterable[str]) -> dict[str, int]:
    names = list(reasons)
    found = cache.get_many([COUNTER_PREFIX + r for r in names])
    return {r: int(found.get(COUNTER_PREFIX + r, 0)) for r in names}
