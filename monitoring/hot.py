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


def node_key(node_id: int) -> str:
    """The cache key of one node's newest samples: {gpu id: a tuple in Latest's field order}."""
    return f"tm:node:{node_id}"


def latest_get(gpus: Iterable[tuple[int, int]]) -> dict[int, Latest]:
    """(gpu id, node id) pairs → the latest sample of each GPU that has one (one cache read for them all)."""
    pairs = list(gpus)
    found = cache.get_many({node_key(node_id) for _, node_id in pairs})
    fresh_after = time.time() - LATEST_TTL
    out = {}
    for gpu_id, node_id in pairs:
        raw = found.get(node_key(node_id), {}).get(gpu_id)
        if raw is not None and raw[0] >= fresh_after:
            out[gpu_id] = Latest(*raw)
    return out


# --- counters of the ingest (accepted, and rejected or clamped by reason) -------------------

COUNTER_PREFIX = "tm:count:"


def exchange(*, incr: dict[str, int] | None = None, incr_timeout: int | None = None, get: Iterable[str] = (),
             put: dict | None = None, put_timeout: int | None = None) -> tuple[dict[str, int], dict]:
    """Add to counters, read keys and write values in one cache round trip; returns (the
    counters' new values, the values found).

    On Redis it is one pipeline (INCRBY/EXPIRE, GET, SET EX), values serialized as Django's
    cache does, so `cache.get` reads them back. The ingest calls this twice per agent
    request; through the cache API it took five round trips, and Django's cache.incr
    asks EXISTS before every INCRBY. Other caches (local memory, embedded) go through the
    cache API.
    """
    incr = {k: n for k, n in (incr or {}).items() if n}
    get = list(get)
    put = put or {}
    backend = getattr(cache, "_cache", None)
    if not hasattr(backend, "get_client"):
        return _exchange_by_api(incr, incr_timeout, get, put, put_timeout)
    key = cache.make_and_validate_key
    pipe = backend.get_client(None, write=True).pipeline(transaction=False)
    for name, n in incr.items():
        pipe.incrby(key(name), n)
        if incr_timeout is not None:
            pipe.expire(key(name), incr_timeout)
    for name in get:
        pipe.get(key(name))
    for name, value in put.items():
        pipe.set(key(name), backend._serializer.dumps(value), ex=put_timeout)
    replies = pipe.execute()
    step = 1 if incr_timeout is None else 2
    counts = {name: int(replies[i * step]) for i, name in enumerate(incr)}
    offset = len(incr) * step
    found = {name: backend._serializer.loads(raw)
             for name, raw in zip(get, replies[offset:offset + len(get)]) if raw is not None}
    return counts, found


def _exchange_by_api(incr, incr_timeout, get, put, put_timeout) -> tuple[dict[str, int], dict]:
    counts = {}
    for name, n in incr.items():
        try:
            counts[name] = cache.incr(name, n)
        except ValueError:
            counts[name] = n if cache.add(name, n, timeout=incr_timeout) else cache.incr(name, n)
    found = cache.get_many(get) if get else {}
    if put:
        cache.set_many(put, timeout=put_timeout)
    return counts, found


def counter_amounts(reasons: dict[str, int]) -> dict[str, int]:
    """The shared counters' keys for these reasons (to add with `exchange`)."""
    return {COUNTER_PREFIX + reason: n for reason, n in reasons.items()}


def count(reasons: dict[str, int]) -> None:
    """Add to the shared counters (cache-wide, so every web replica reports the same totals)."""
    exchange(incr=counter_amounts(reasons))


def counters(reasons: Iterable[str]) -> dict[str, int]:
    names = list(reasons)
    found = cache.get_many([COUNTER_PREFIX + r for r in names])
    return {r: int(found.get(COUNTER_PREFIX + r, 0)) for r in names}
