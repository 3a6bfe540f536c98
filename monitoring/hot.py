"""The latest sample of every GPU, kept hot in the cache (Redis in production, local memory embedded).

One entry per node (`tm:hot:<id>`) with the newest sample of each of its GPUs, merged per
GPU by timestamp: a request updates only the GPUs it carries good samples of, and an older
sample (a backlog arriving after newer ones) never replaces a newer one. It is written in
the ingest's pipelined round trip and read with one round trip for a page, a scrape or an
alert evaluation: nothing here touches the database. A GPU whose agent stopped reporting
drops out after LATEST_TTL seconds.

These values live only in Redis, so while it is unreachable reading or writing them raises
ServiceUnavailable (503 `broker_unavailable`) rather than answering "no data".
"""
from __future__ import annotations

import threading
import time
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from typing import NamedTuple

from django.core.cache import cache

from common import redis_cache
from common.outages import REDIS_UNREACHABLE
from common.errors import broker_unavailable

# A sample older than this is "no data" (the GPU's agent stopped reporting).
LATEST_TTL = 120
# Keys live longer than that (as long as the agent's stream position, written with them);
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
    processes: tuple[tuple[int, int], ...] = ()  # (pid, used MiB)
    # Memory used per share of the GPU (monitoring.shares.attribute): (reservation id or None, MIG
    # instance or "", used MiB, GPU instance id or None). Last, with a default: values cached before
    # it existed read back without it.
    shares: tuple[tuple, ...] = ()
    # What the source reports of the card's health (monitoring.ingest.HEALTH_FIELDS), None where it does not.
    sm_clock: int | None = None
    ecc_corrected: int | None = None
    ecc_uncorrected: int | None = None
    xid: int | None = None  # the last XID error's code

    @property
    def mem_pct(self) -> float:
        return 100.0 * self.mem_used / self.mem_total if self.mem_total else 0.0


def node_key(node_id: int) -> str:
    """The cache key of one node's newest samples, per GPU: on Redis a hash (field "<gpu id>": a tuple in
    Latest's field order, "t:<gpu id>": its timestamp), in local memory a dict {gpu id: the tuple}. Named
    anew (it was `tm:node:<id>`, one plain value) so that no old value meets a hash command."""
    return f"tm:hot:{node_id}"


def latest_get(gpus: Iterable[tuple[int, int]]) -> dict[int, Latest]:
    """(gpu id, node id) pairs → the latest sample of each GPU that has one (one cache round trip for them all)."""
    wanted: dict[int, list[int]] = defaultdict(list)
    for gpu_id, node_id in gpus:
        wanted[node_id].append(gpu_id)
    if not wanted:
        return {}
    client = _redis_client()
    found: dict[int, tuple] = {}
    if client is None:
        nodes = cache.get_many([node_key(node_id) for node_id in wanted])
        for node_id, gpu_ids in wanted.items():
            values = nodes.get(node_key(node_id), {})
            found.update((gpu_id, values[gpu_id]) for gpu_id in gpu_ids if gpu_id in values)
    else:
        pipe = client.pipeline(transaction=False)
        for node_id, gpu_ids in wanted.items():
            pipe.hmget(cache.make_and_validate_key(node_key(node_id)), gpu_ids)
        loads = cache._cache._serializer.loads
        for gpu_ids, values in zip(wanted.values(), _execute(pipe)):
            found.update((gpu_id, loads(raw)) for gpu_id, raw in zip(gpu_ids, values) if raw is not None)
    fresh_after = time.time() - LATEST_TTL
    return {gpu_id: Latest(*raw) for gpu_id, raw in found.items() if raw[0] >= fresh_after}


# Merges one node's new samples into its hash: a GPU's values are replaced only by newer ones.
# KEYS[1]: the node's hash; ARGV: its TTL, then gpu id, timestamp, values for each GPU. Redis runs
# a script whole, with no other command in between, so two requests of one node (an agent
# resending a request that timed out while the first is still being handled, on another web
# worker) cannot both read the old timestamp and let the older one write last.
_MERGE_NEWEST = """
for i = 2, #ARGV, 3 do
  local seen = redis.call('HGET', KEYS[1], 't:' .. ARGV[i])
  if not seen or tonumber(seen) <= tonumber(ARGV[i + 1]) then
    redis.call('HSET', KEYS[1], ARGV[i], ARGV[i + 2], 't:' .. ARGV[i], ARGV[i + 1])
  end
end
redis.call('EXPIRE', KEYS[1], ARGV[1])
"""
# Raises KEYS[1], a stream position (a non-negative integer), to ARGV[1] if it is lower, and returns the
# position after. Written whole by Redis, so two overlapping requests of one stream (a resend of a
# request that timed out) can only move it forward. Compared as decimal strings (length, then digits):
# Lua's numbers are doubles, exact only up to 2^53, and positions go up to 2^63 - 1.
_ADVANCE_POSITION = """
local seen = redis.call('GET', KEYS[1])
local new = ARGV[1]
if not seen or #seen < #new or (#seen == #new and seen < new) then
  redis.call('SET', KEYS[1], new, 'EX', ARGV[2])
  return new
end
redis.call('EXPIRE', KEYS[1], ARGV[2])
return seen
"""
# Without Redis (local memory: one process's own cache, every writer a thread of it) a lock
# makes the read-merge-write of a node's entry whole.
_merge_lock = threading.Lock()


def _redis_client():
    """The redis-py client behind the cache, or None for another cache (local memory, embedded)."""
    backend = getattr(cache, "_cache", None)
    if not hasattr(backend, "get_client"):
        return None
    if not redis_cache.outage.admit():
        raise broker_unavailable()
    return backend.get_client(None, write=True)


def _execute(pipe) -> list:
    """Run a pipeline; Redis unreachable is a ServiceUnavailable, and the cache's outage memory learns of it."""
    try:
        replies = pipe.execute()
    except REDIS_UNREACHABLE as error:
        redis_cache.outage.failed()
        raise broker_unavailable() from error
    redis_cache.outage.recovered()
    return replies


# --- counters of the ingest (accepted, and rejected or clamped by reason) -------------------

COUNTER_PREFIX = "tm:count:"


class Exchanged(NamedTuple):
    counts: dict[str, int]  # the counters' new values
    found: dict  # the values read
    positions: dict[str, int]  # each advanced position after the write


def exchange(*, incr: dict[str, int] | None = None, incr_timeout: int | None = None, get: Iterable[str] = (),
             put: dict | None = None, put_timeout: int | None = None,
             newest: dict[int, dict[int, tuple]] | None = None,
             advance: dict[str, int] | None = None, advance_timeout: int = STORE_TTL) -> Exchanged:
    """Add to counters, read keys, write values, merge GPUs' newest samples ({node id: {gpu id:
    values}}, see node_key) and move positions forward ({key: at least this non-negative integer},
    never back) in one cache round trip.

    On Redis it is one pipeline (INCRBY/EXPIRE, GET, SET EX, EVAL), values serialized as Django's
    cache does, so `cache.get` reads them back. The ingest calls this twice per agent
    request; through the cache API it took five round trips, and Django's cache.incr
    asks EXISTS before every INCRBY. Other caches (local memory, embedded) go through the
    cache API.
    """
    incr = {k: n for k, n in (incr or {}).items() if n}
    get = list(get)
    put = put or {}
    newest = newest or {}
    advance = advance or {}
    client = _redis_client()
    if client is None:
        _merge_by_api(newest)
        positions = _advance_by_api(advance, advance_timeout)
        return Exchanged(*_exchange_by_api(incr, incr_timeout, get, put, put_timeout), positions)
    backend = cache._cache
    key = cache.make_and_validate_key
    pipe = client.pipeline(transaction=False)
    for name, n in incr.items():
        pipe.incrby(key(name), n)
        if incr_timeout is not None:
            pipe.expire(key(name), incr_timeout)
    for name in get:
        pipe.get(key(name))
    for name, value in put.items():
        pipe.set(key(name), backend._serializer.dumps(value), ex=put_timeout)
    for node_id, gpus in newest.items():
        # EVAL, not EVALSHA through a redis-py Script: in a pipeline a Script first asks SCRIPT EXISTS,
        # one more round trip per request; Redis keeps the compiled script by its digest either way.
        args = [STORE_TTL]
        for gpu_id, values in gpus.items():
            args += (gpu_id, values[0], backend._serializer.dumps(values))
        pipe.eval(_MERGE_NEWEST, 1, key(node_key(node_id)), *args)
    for name, position in advance.items():
        pipe.eval(_ADVANCE_POSITION, 1, key(name), int(position), advance_timeout)
    replies = _execute(pipe)
    step = 1 if incr_timeout is None else 2
    counts = {name: int(replies[i * step]) for i, name in enumerate(incr)}
    offset = len(incr) * step
    found = {name: backend._serializer.loads(raw)
             for name, raw in zip(get, replies[offset:offset + len(get)]) if raw is not None}
    positions = {name: int(raw) for name, raw in zip(advance, replies[len(replies) - len(advance):])}
    return Exchanged(counts, found, positions)


def _merge_by_api(newest: dict[int, dict[int, tuple]]) -> None:
    if not newest:
        return
    with _merge_lock:
        entries = cache.get_many([node_key(node_id) for node_id in newest])
        for node_id, gpus in newest.items():
            entry = entries.setdefault(node_key(node_id), {})
            for gpu_id, values in gpus.items():
                if gpu_id not in entry or entry[gpu_id][0] <= values[0]:
                    entry[gpu_id] = values
        cache.set_many(entries, timeout=STORE_TTL)


def _advance_by_api(advance: dict[str, int], timeout: int) -> dict[str, int]:
    if not advance:
        return {}
    with _merge_lock:
        found = cache.get_many(list(advance))
        positions = {name: max(position, found.get(name, position)) for name, position in advance.items()}
        cache.set_many(positions, timeout=timeout)
    return positions


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
