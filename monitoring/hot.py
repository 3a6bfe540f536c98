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


def incr_many(amounts: dict[str, int], timeout: int | None = None) -> dict[str, int]:
    """Add to counters in the cache; returns their new values.

    On Redis: INCRBY (and EXPIRE) in one pipeline. Django's cache.incr would first ask
    EXISTS, a second round trip per counter, on the hottest path we have.
    """
    amounts = {k: n for k, n in amounts.items() if n}
    if not amounts:
        return {}
    backend = getattr(cache, "_cache", None)
    if hasattr(backend, "get_client"):
        keys = {name: cache.make_and_validate_key(name) for name in amounts}
        pipe = backend.get_client(next(iter(keys.values())), write=True).pipeline(transaction=False)
        for name, n in amounts.items():
            pipe.incrby(keys[name], n)
            if timeout is not None:
                pipe.expire(keys[name], timeout)
        replies = pipe.execute()
        step = 1 if timeout is None else 2
        return {name: int(replies[i * step]) for i, name in enumerate(amounts)}
    out = {}
    for name, n in amounts.items():
        try:
            out[name] = cache.incr(name, n)
        except ValueError:
            out[name] = n if cache.add(name, n, timeout=timeout) else cache.incr(name, n)
    return out


def count(reasons: dict[str, int]) -> None:
    """Add to the shared counters (cache-wide, so every web replica reports the same totals)."""
    incr_many({COUNTER_PREFIX + reason: n for reason, n in reasons.items()})


def counters(reasons: Iterable[str]) -> dict[str, int]:
    names = list(reasons)
    found = cache.get_many([COUNTER_PREFIX + r for r in names])
    return {r: int(found.get(COUNTER_PREFIX + r, 0)) for r in names}
