"""Telemetry ingest: what one agent request does, from parsing to history, hot cache and live push.

How 10,000 GPUs at 1 Hz fit on a small machine
----------------------------------------------
The target is 10,000 samples a second. An ORM `save()` per sample would be 10,000
transactions a second; here each agent request is one transaction whatever its size:

1. an agent's request is decoded straight into typed structs by msgspec (types checked in
   C; decode_body); a request with any value of the wrong type is read as plain JSON and
   checked field by field instead, so one bad sample costs only itself. Every bad value
   is rejected or clamped with a named reason, counted in the cache and logged once per
   request;
2. history: one `INSERT … SELECT FROM unnest(arrays) ON CONFLICT DO NOTHING` of narrow
   rows (integer ids and epoch seconds, no foreign-key checks) into the raw table (SQLite:
   one bulk_create). The
   (gpu, ts) unique index makes a resent batch harmless. Raw rows live an hour; a
   periodic task turns them into per-minute and per-hour aggregates (rollup.py) which
   are what the 24-hour and 30-day charts read. We keep raw in the database rather than
   only in Redis so that rollups are exact SQL aggregates over what was accepted and the
   embedded mode (SQLite, no Redis) works the same way;
3. hot values: one cache entry per node with the newest sample of each of its GPUs,
   merged per GPU by timestamp (hot.py) in the same pipelined round trip as the stream
   position and the counters;
4. live: one message per WebSocket group (pool, node, team) per request, with every GPU
   of that group the batch carried, sent after commit (live.py).

An agent's GPUs and their pools/teams come from a per-host map cached for
HOST_MAP_TTL seconds, so steady-state ingest reads nothing from the database. At 10 s,
rebuilding the maps of 100 hosts took 8% of the ingest's CPU; at 30 s a GPU's samples
reach its team's live group at most 30 s after a reservation starts or ends, and a newly
registered GPU's samples are refused as unknown for at most as long.
"""
from __future__ import annotations

import hashlib
import logging
import math
import random
import time
from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

import msgspec
import orjson
from django.conf import settings
from django.core.cache import cache
from django.db import connection, transaction
from django.utils import timezone
from django.utils.translation import gettext as _

from common.errors import ApplicationError, PayloadTooLarge, ValidationFailed
from inventory import services as inventory_services
from inventory.models import Gpu, HostToken
from monitoring import hot, live, shares
from monitoring.models import Sample

log = logging.getLogger(__name__)

HOST_MAP_TTL = 30
MAX_PROCESSES = 64
MAX_NAME = 64  # a process's user or MIG device UUID, as kept

# Every reason a sample (or a request) can be rejected or clamped for; /metrics reports each.
REJECT_REASONS = ("malformed", "unknown_gpu", "negative_memory", "memory_out_of_range", "future_timestamp", "too_old",
                  "temperature_out_of_range", "power_out_of_range", "duplicate", "oversized_batch", "flood")
# Memory columns are 32-bit integers (MiB): 2 PiB, far above any GPU. Beyond it one sample would fail
# the whole request's INSERT on PostgreSQL.
MAX_MEMORY_MIB = 2**31 - 1
MAX_SEQ = 2**63 - 1
CLAMP_REASONS = ("utilization_clamped", "memory_clamped")


class Flooding(ApplicationError):
    status = 429


class StorageBusy(ApplicationError):
    status = 503


# What `python -m agent` sends, as msgspec decodes it: numbers may be ints or floats (a float field
# takes both), never booleans; unknown fields are ignored. gc=False: these hold only numbers,
# strings and each other, so they can form no reference cycle, and the garbage collector need
# not track the ~200 of them each request makes (measured: 296 -> 110 young collections per 350
# requests, 0.75 -> 0.55 ms of collection per request).
class WireProcess(msgspec.Struct, gc=False):
    pid: int
    used_memory_mib: int
    # Sent by agents since processes are attributed to shares (monitoring.shares); older agents send
    # neither, and their processes count for the GPU's only holder or for nobody.
    user: str = ""
    mig_uuid: str = ""
    gpu_instance_id: int | None = None


class WireSample(msgspec.Struct, gc=False):
    uuid: str
    utilization_gpu_pct: float
    memory_used_mib: float
    memory_total_mib: float
    temperature_c: float
    utilization_memory_pct: float = 0.0
    power_w: float = 0.0
    processes: list[WireProcess] = []
    # Optional health figures (absent: the source does not report them): SM clock, volatile ECC error
    # counts, the last XID error's code. Kept with the newest sample (hot values, live), not in history.
    sm_clock_mhz: int | None = None
    ecc_corrected: int | None = None
    ecc_uncorrected: int | None = None
    xid: int | None = None


class WireBatch(msgspec.Struct, gc=False):
    seq: int
    t: float
    gpus: list[WireSample]


class WirePayload(msgspec.Struct, gc=False):
    stream: str
    batches: list[WireBatch]


_DECODER = msgspec.json.Decoder(WirePayload)


def decode_body(body: bytes):
    """An agent's request body: a WirePayload when every value has the type agents send (decoded
    and type-checked in C, ~0.1 ms for 100 GPUs), else the plain JSON for telemetry_ingest to check
    value by value. Raises ValueError when the body is not JSON (NaN and Infinity included)."""
    try:
        return _DECODER.decode(body)
    except msgspec.ValidationError:
        return orjson.loads(body)
    except msgspec.DecodeError as error:
        raise ValueError(str(error)) from None


class GpuRef(NamedTuple):
    gpu_id: int
    uuid: str
    pool_id: int | None
    node_id: int
    team_id: int | None
    holders: tuple[shares.Holder, ...] = ()  # the shares held now, to attribute processes to


@dataclass
class IngestResult:
    accepted: int = 0
    ack: int | None = None
    rejected: Counter = field(default_factory=Counter)
    clamped: Counter = field(default_factory=Counter)

    def as_dict(self) -> dict:
        return {"accepted": self.accepted, "ack": self.ack, "rejected": dict(self.rejected),
                "clamped": dict(self.clamped)}


def _host_key(token: HostToken) -> str:
    return f"tm:host:{token.pk}"


def _cluster_key(cluster_id: int) -> str:
    return f"tm:cluster:{cluster_id}"


def host_gpus(token: HostToken, now=None, cached: dict | None = None) -> dict[str, GpuRef]:
    """uuid → the GPU of this token's host, with its pool, node and the team holding it now (cached)."""
    return _gpu_map(_host_key(token), lambda: Gpu.objects.filter(node__cluster_id=token.cluster_id,
                                                                 node__name=token.host_name), now, cached)


def cluster_gpus(cluster_id: int, now=None) -> dict[str, GpuRef]:
    """uuid → every GPU of a Kubernetes cluster, as host_gpus gives a host's (cached the same way): what
    the portal's reads of the cluster's DCGM exporter or Prometheus are checked against."""
    return _gpu_map(_cluster_key(cluster_id), lambda: Gpu.objects.filter(node__cluster_id=cluster_id), now, None)


def hosts_gpus(tokens: Sequence[HostToken], cached: dict) -> dict[int, dict[str, GpuRef]]:
    """host_gpus of several tokens (by token id), `cached` holding the maps the cache had: those it lacks
    are built together, one query for their GPUs and one for the shares on them, and cached in one write.
    The agents' socket gathers many hosts per ingest, and one by one their rebuilds (each host's map
    every HOST_MAP_TTL) were two queries each: about 40 % of the ingest thread's time at 1,250 hosts."""
    missing = {_host_key(t): t for t in tokens if _host_key(t) not in cached}
    if missing:
        wanted = {(t.cluster_id, t.host_name) for t in missing.values()}
        by_host: dict[tuple[int, str], list[tuple]] = defaultdict(list)
        for gpu_id, uuid, pool_id, node_id, cluster_id, host in Gpu.objects.filter(
                node__cluster_id__in={c for c, _ in wanted}, node__name__in={h for _, h in wanted}).values_list(
                "id", "uuid", "pool_id", "node_id", "node__cluster_id", "node__name"):
            if (cluster_id, host) in wanted:
                by_host[(cluster_id, host)].append((gpu_id, uuid, pool_id, node_id))
        rows = {row[0]: row for row in _map_rows([g for gpus in by_host.values() for g in gpus], timezone.now())}
        built = {key: [rows[g[0]] for g in by_host.get((t.cluster_id, t.host_name), ())] for key, t in missing.items()}
        # One expiry for the lot, jittered between lots, as _gpu_map jitters each map.
        cache.set_many(built, HOST_MAP_TTL * random.uniform(0.5, 1.0))
        cached = {**cached, **built}
    return {t.pk: host_gpus(t, cached=cached) for t in tokens}


def _map_rows(gpus: list[tuple], now) -> list[tuple]:
    """(id, uuid, pool, node, the team holding it, its holders) of each GPU (id, uuid, pool, node) given.
    Plain tuples: this is read back on every request, and tuples unpickle fastest."""
    holders = shares.holders_by_gpu(shares.shares_now(now, [g[0] for g in gpus]))
    return [(gpu_id, uuid, pool_id, node_id, holders[gpu_id][0].team_id if gpu_id in holders else None,
             tuple(tuple(h) for h in holders.get(gpu_id, ())))
            for gpu_id, uuid, pool_id, node_id in gpus]


def _gpu_map(key: str, gpus_of, now, cached: dict | None) -> dict[str, GpuRef]:
    rows = cached.get(key) if cached is not None else cache.get(key)
    if rows is None:
        rows = _map_rows(list(gpus_of().values_list("id", "uuid", "pool_id", "node_id")), now or timezone.now())
        # Jittered: hosts that started together must not all rebuild their maps in the same second.
        cache.set(key, rows, HOST_MAP_TTL * random.uniform(0.5, 1.0))
    return {row[1]: GpuRef(*row[:5], tuple(shares.Holder(*h) for h in row[5]) if len(row) > 5 else ())
            for row in rows}


def _number(value) -> float:
    kind = type(value)  # exact types: True is an int to isinstance, not a number here
    if kind is int or (kind is float and math.isfinite(value)):
        return value
    raise TypeError


def _flood_key(token: HostToken, now: float) -> str:
    return f"tm:flood:{token.pk}:{int(now // 60)}"


def _refuse_flood(token: HostToken, samples: int, total: int) -> None:
    """At most TELEMETRY_MAX_SAMPLES_PER_AGENT_MINUTE samples per agent per clock minute."""
    if total <= settings.TELEMETRY_MAX_SAMPLES_PER_AGENT_MINUTE:
        return
    hot.count({"flood": samples})
    log.warning("telemetry from %s/%s refused: %d samples this minute (limit %d)", token.cluster.slug,
                token.host_name, total, settings.TELEMETRY_MAX_SAMPLES_PER_AGENT_MINUTE)
    raise Flooding(_("More than %(limit)d samples this minute from this host; slow down.")
                   % {"limit": settings.TELEMETRY_MAX_SAMPLES_PER_AGENT_MINUTE}, field="batches", rule="flood")


def telemetry_ingest(*, token: HostToken, payload, now: float | None = None) -> IngestResult:
    """Validate and store one agent request: {"stream": str, "batches": [{"seq", "t", "gpus": [...]}, ...]}.

    Bad samples are dropped or clamped with a counted reason and the rest is kept; only
    a malformed envelope (400), an oversized request (413) or a flooding agent (429) is
    refused as a whole. `ack` is the highest seq the portal now holds for this stream:
    the agent forgets everything up to it and resends the rest after a drop.
    """
    outcome = telemetry_ingest_many([(token, payload)], now=now)[0]
    if isinstance(outcome, ApplicationError):
        raise outcome
    return outcome


def telemetry_ingest_many(deliveries: Sequence[tuple[HostToken, object]], *, now: float | None = None,
                          note_seen: bool = False) -> list[IngestResult | ApplicationError]:
    """Several agents' requests at once, each judged as telemetry_ingest judges one: the outcome of each,
    in order, is its result or the error that refused it (one agent's bad request costs only itself).

    What the agents' WebSocket (monitoring.consumers.AgentTelemetryConsumer) gathers over a few
    milliseconds goes through here together: one cache round trip for the hosts' maps, positions and
    flood counts, one INSERT, one round trip for the hot values, one live message per group. An HTTP
    request pays Django's request cost (~0.5 ms of middleware and authentication) and all of that for
    each host; at 1,250 hosts a second that alone was more than this machine's two cores.

    `note_seen`: the hosts whose requests were taken are alive (inventory.services.hosts_seen), for senders
    that stop their HTTP heartbeats while they send this way (the agents' telemetry socket)."""
    now = time.time() if now is None else now
    outcomes: list[IngestResult | ApplicationError | None] = [None] * len(deliveries)
    checked = []  # (index, token, batches, size, stream key)
    for index, (token, payload) in enumerate(deliveries):
        try:
            stream, batches, size = _envelope(token, payload)
        except ApplicationError as error:
            outcomes[index] = error
            continue
        checked.append((index, token, batches, size, _stream_key(token, stream)))
    if not checked:
        return outcomes
    flood: Counter = Counter()
    for _index, token, _batches, size, _key in checked:
        flood[_flood_key(token, now)] += size
    # One cache round trip: count these requests against their hosts' minutes, and read the hosts' GPU
    # maps and the streams' positions.
    totals, cached, _positions = hot.exchange(
        incr=dict(flood), incr_timeout=120,
        get=list(dict.fromkeys([_host_key(c[1]) for c in checked] + [c[4] for c in checked])))
    admitted = []
    for index, token, batches, size, stream_key in checked:
        try:
            _refuse_flood(token, size, totals.get(_flood_key(token, now), 0))
        except Flooding as error:
            outcomes[index] = error
            continue
        admitted.append((index, token, batches, stream_key))
    maps = hosts_gpus([token for _index, token, _batches, _key in admitted], cached)
    senders, owners = [], []
    for index, token, batches, stream_key in admitted:
        senders.append(Sender(refs=maps[token.pk], batches=batches,
                              who=f"{token.cluster.slug}/{token.host_name}", stream_key=stream_key,
                              last_seq=cached.get(stream_key, -1)))
        owners.append(index)
    for index, outcome in zip(owners, _ingest(senders, now)):
        outcomes[index] = outcome
    if note_seen:
        # A host's GPUs are all on its node: any of them names it. (A host without GPUs sends no telemetry.)
        inventory_services.hosts_seen(node_ids=sorted({next(iter(sender.refs.values())).node_id
                                                       for sender in senders if sender.refs}))
    return outcomes


def _envelope(token: HostToken, payload) -> tuple[str, list, int]:
    """(stream, batches, samples) of a request, or the error that refuses it whole."""
    if isinstance(payload, WirePayload):
        stream, batches = payload.stream, payload.batches
    elif isinstance(payload, dict) and isinstance(payload.get("batches"), list):
        stream, batches = payload.get("stream"), payload["batches"]
    else:
        hot.count({"malformed": 1})
        raise ValidationFailed(_('Send {"stream": ..., "batches": [{"seq", "t", "gpus": [...]}]}.'),
                               field="batches", rule="malformed")
    if not isinstance(stream, str) or not 1 <= len(stream) <= 64:
        hot.count({"malformed": 1})
        raise ValidationFailed(_("stream must be a string of 1 to 64 characters."), field="stream", rule="malformed")
    size = sum(_batch_size(b) for b in batches)
    if size > settings.TELEMETRY_MAX_SAMPLES_PER_REQUEST:
        hot.count({"oversized_batch": size})
        log.warning("telemetry from %s/%s refused: %d samples in one request (limit %d)", token.cluster.slug,
                    token.host_name, size, settings.TELEMETRY_MAX_SAMPLES_PER_REQUEST)
        raise PayloadTooLarge(_("%(size)d samples in one request; at most %(limit)d.")
                              % {"size": size, "limit": settings.TELEMETRY_MAX_SAMPLES_PER_REQUEST},
                              field="batches", rule="too_large")
    return stream, batches, size


class Sender(NamedTuple):
    """One source's batches: an agent request, or one read of a Kubernetes cluster."""

    refs: dict[str, GpuRef]  # the GPUs it may send, by UUID
    batches: list
    who: str  # for the log
    # The cache key of the sender's position (the highest seq stored), for senders that number their batches
    # and resend them (agents); the portal's own reads of a cluster have none.
    stream_key: str | None = None
    last_seq: int = -1


def samples_ingest(*, refs: dict[str, GpuRef], batches: list, now: float, who: str, stream_key: str | None = None,
                   last_seq: int = -1) -> IngestResult:
    """Store, cache and push batches of samples of these GPUs: the one pipeline every source feeds (agents
    through telemetry_ingest, a Kubernetes cluster's read through monitoring.kubernetes). A source without
    `stream_key` sends each GPU's sample once (a sample already stored for that GPU and second is a
    duplicate)."""
    outcome = _ingest([Sender(refs, batches, who, stream_key, last_seq)], now)[0]
    if isinstance(outcome, ApplicationError):
        raise outcome
    return outcome


class _Parsed(NamedTuple):
    rows: list[tuple]
    newest: dict[int, tuple[GpuRef, tuple]]  # gpu id → (its ref, its newest values in hot.Latest's field order)
    max_seq: int


def _parse(sender: Sender, result: IngestResult, now: float) -> _Parsed:
    """A sender's rows to store and newest values, with every dropped or clamped sample counted in `result`."""
    oldest = now - settings.TELEMETRY_RAW_RETENTION.total_seconds()
    rows: list[tuple] = []
    newest: dict[int, tuple[GpuRef, tuple]] = {}
    stored: set[tuple[int, int]] = set()  # (gpu id, second) of each row
    max_seq = last_seq = sender.last_seq
    for batch in sender.batches:
        fields = _batch_fields(batch)
        if fields is None:
            result.rejected["malformed"] += _batch_size(batch)
            continue
        seq, ts, samples = fields
        _check_seq(seq)
        if seq <= last_seq:
            result.rejected["duplicate"] += len(samples)
            continue
        max_seq = max(max_seq, seq)
        if ts > now + settings.TELEMETRY_MAX_FUTURE_SECONDS:
            result.rejected["future_timestamp"] += len(samples)
            continue
        if ts < oldest:
            result.rejected["too_old"] += len(samples)
            continue
        second = int(ts)
        for raw in samples:
            parsed = _parse_sample(raw, sender.refs, result)
            if parsed is None:
                continue
            ref, values, procs, health = parsed
            if (ref.gpu_id, second) in stored:
                # History holds one sample per GPU and second; the first one sent is the one kept.
                result.rejected["duplicate"] += 1
                continue
            stored.add((ref.gpu_id, second))
            rows.append((ref.gpu_id, ref.pool_id, second, *values, *health))
            previous = newest.get(ref.gpu_id)
            if previous is None or previous[1][0] <= ts:
                uses = shares.attribute(procs, ref.holders) if procs or ref.holders else ()
                newest[ref.gpu_id] = (ref, (ts, *values, tuple((p[0], p[1]) for p in procs), uses, *health))
    return _Parsed(rows, newest, max_seq)


def _ingest(senders: Sequence[Sender], now: float) -> list[IngestResult | ApplicationError]:
    """What samples_ingest does, for several senders at once (their GPUs are distinct): one INSERT, one live
    message per group, one cache round trip."""
    outcomes: list[IngestResult | ApplicationError] = []
    parsed: list[_Parsed | None] = []
    for sender in senders:
        result = IngestResult(ack=sender.last_seq if sender.last_seq >= 0 else None)
        try:
            parsed.append(_parse(sender, result, now))
            outcomes.append(result)
        except ApplicationError as error:  # a bad seq refuses this sender's request whole, nothing of it kept
            parsed.append(None)
            outcomes.append(error)
    # One statement, in autocommit: committed when it returns, so what follows is after commit.
    # Rows another request stored first (an overlapping resend) are not inserted and not accepted.
    stored = _store_raw([p.rows if p is not None else [] for p in parsed])
    newest: dict[int, tuple[GpuRef, tuple]] = {}
    advance: dict[str, int] = {}
    counted: Counter = Counter()
    for sender, outcome, part, accepted in zip(senders, outcomes, parsed, stored):
        if part is None:
            continue
        outcome.accepted = accepted
        if accepted < len(part.rows):
            outcome.rejected["duplicate"] += len(part.rows) - accepted
        for gpu_id, latest in part.newest.items():  # a GPU twice (an agent's old and new connection): the newer
            if gpu_id not in newest or newest[gpu_id][1][0] <= latest[1][0]:
                newest[gpu_id] = latest
        if sender.stream_key is not None and part.max_seq > sender.last_seq:
            advance[sender.stream_key] = part.max_seq
        counted.update({"accepted": accepted, **outcome.rejected, **outcome.clamped})
    # Live first: the dashboards wait on this push, not on the hot values written below.
    live.send(_group_payloads(newest))
    _mark_late_minutes([row for part in parsed if part is not None for row in part.rows], now)
    per_node: dict[int, dict[int, tuple]] = defaultdict(dict)
    for gpu_id, (ref, latest) in newest.items():
        per_node[ref.node_id][gpu_id] = latest
    # One round trip for the hot values, the streams' new positions and the counters. The hot values
    # are merged per GPU and a position only moves forward: a GPU whose samples were all rejected here
    # keeps its last good one, and a resent request finishing after the one that replaced it puts
    # neither older values nor a lower position back.
    _totals, _cached, positions = hot.exchange(newest=per_node, advance=advance,
                                               incr=hot.counter_amounts(dict(counted)))
    for sender, outcome in zip(senders, outcomes):
        if isinstance(outcome, ApplicationError):
            continue
        if sender.stream_key in positions:
            outcome.ack = positions[sender.stream_key]
        if outcome.rejected or outcome.clamped:
            log.warning("telemetry from %s: %d accepted, rejected %s, clamped %s", sender.who, outcome.accepted,
                        dict(outcome.rejected), dict(outcome.clamped))
    return outcomes


def _stream_key(token: HostToken, stream: str) -> str:
    """The cache key of a stream's position (the highest seq stored), one per agent run: a digest, as
    the stream id is whatever string the agent chose."""
    return f"tm:stream:{token.pk}:{hashlib.blake2b(stream.encode(), digest_size=12).hexdigest()}"


def _check_seq(seq: int) -> None:
    """A seq is a position in the stream, a 64-bit signed integer at most (the agent counts from 1): one
    beyond would become the stream's position, and every later batch would be dropped as already held."""
    if not 0 <= seq <= MAX_SEQ:
        hot.count({"malformed": 1})
        rule = "min_value" if seq < 0 else "max_value"
        raise ValidationFailed(_("seq must be an integer from 0 to %(max)d.") % {"max": MAX_SEQ}, field="seq", rule=rule)


def _batch_size(batch) -> int:
    """Samples in a batch as sent (a batch without a list of samples counts as one)."""
    if isinstance(batch, WireBatch):
        return len(batch.gpus)
    return len(batch["gpus"]) if isinstance(batch, dict) and isinstance(batch.get("gpus"), list) else 1


def _batch_fields(batch) -> tuple[int, float, list] | None:
    """(seq, t, samples) of a batch, or None when it is malformed."""
    if isinstance(batch, WireBatch):
        return batch.seq, batch.t, batch.gpus
    try:
        samples = batch["gpus"]
        if not isinstance(samples, list):
            raise TypeError
        return int(_number(batch["seq"])), float(_number(batch["t"])), samples
    except (TypeError, KeyError, ValueError, OverflowError):
        return None


HEALTH_FIELDS = ("sm_clock_mhz", "ecc_corrected", "ecc_uncorrected", "xid")
NO_HEALTH = (None, None, None, None)
# Beyond these a figure is not believable (a clock in MHz, an error count, an XID code) or does not fit its
# column (monitoring.models.Sample): left out, not stored.
HEALTH_MAX = (2**15 - 1, 2**31 - 1, 2**31 - 1, 2**15 - 1)


def _sample_values(raw) -> tuple:
    """(uuid, util, mem_util, used, total, temp, power, processes, health) of one sample as sent, each process
    (pid, used MiB, user, MIG device UUID or "", GPU instance id or None), health the optional figures of
    HEALTH_FIELDS (None each where absent or not believable: they never cost the sample); raises
    TypeError, KeyError, ... when a value is missing or not a number."""
    if isinstance(raw, WireSample):
        health = (raw.sm_clock_mhz, raw.ecc_corrected, raw.ecc_uncorrected, raw.xid)
        return (raw.uuid, raw.utilization_gpu_pct, raw.utilization_memory_pct, raw.memory_used_mib,
                raw.memory_total_mib, raw.temperature_c, raw.power_w,
                tuple((p.pid, max(0, p.used_memory_mib), p.user[:MAX_NAME], p.mig_uuid[:MAX_NAME], p.gpu_instance_id)
                      for p in raw.processes[:MAX_PROCESSES]),
                NO_HEALTH if health == NO_HEALTH else _health(health))
    processes = raw.get("processes") or []
    return (raw["uuid"], _number(raw["utilization_gpu_pct"]), _number(raw.get("utilization_memory_pct", 0)),
            _number(raw["memory_used_mib"]), _number(raw["memory_total_mib"]), _number(raw["temperature_c"]),
            _number(raw.get("power_w", 0)),
            tuple(_process(p) for p in processes[:MAX_PROCESSES]),
            _health(tuple(raw.get(name) for name in HEALTH_FIELDS)))


def _health(values: tuple) -> tuple:
    return tuple(v if type(v) is int and 0 <= v <= most else None for v, most in zip(values, HEALTH_MAX))


def _process(raw) -> tuple:
    """A process sent as plain JSON: pid and memory must be numbers (else the sample is malformed, as
    before); a user, MIG UUID or instance id of the wrong type is only left out, so a sample is never
    lost over what attribution needs."""
    user, mig_uuid, gi = raw.get("user"), raw.get("mig_uuid"), raw.get("gpu_instance_id")
    return (int(_number(raw["pid"])), max(0, int(_number(raw["used_memory_mib"]))),
            user[:MAX_NAME] if isinstance(user, str) else "", mig_uuid[:MAX_NAME] if isinstance(mig_uuid, str) else "",
            gi if type(gi) is int else None)


def _parse_sample(raw, refs: dict[str, GpuRef], result: IngestResult) -> tuple[GpuRef, tuple, tuple, tuple] | None:
    """One sample → (its GPU, (util, mem_util, mem_used, mem_total, temp, power), processes, health), or None
    with the reason counted. Plain tuples: this runs 10,000 times a second."""
    try:
        uuid, util, mem_util, used, total, temp, power, procs, health = _sample_values(raw)
        ref = refs.get(uuid)
    except (TypeError, KeyError, ValueError, AttributeError, OverflowError):
        result.rejected["malformed"] += 1
        return None
    if ref is None:
        result.rejected["unknown_gpu"] += 1
        return None
    if used < 0 or total <= 0:
        result.rejected["negative_memory"] += 1
        return None
    if total > MAX_MEMORY_MIB:
        result.rejected["memory_out_of_range"] += 1
        return None
    if not -40 <= temp <= 150:
        result.rejected["temperature_out_of_range"] += 1
        return None
    if not 0 <= power <= 5000:
        result.rejected["power_out_of_range"] += 1
        return None
    if not (0 <= util <= 100 and 0 <= mem_util <= 100):
        result.clamped["utilization_clamped"] += 1
        util, mem_util = min(100, max(0, util)), min(100, max(0, mem_util))
    if used > total:
        result.clamped["memory_clamped"] += 1
        used = total
    return (ref, (round(util), round(mem_util), int(used), int(total), round(temp), round(float(power), 1)), procs,
            health)


COLUMNS = ("gpu_id", "pool_id", "ts", "util", "mem_util", "mem_used", "mem_total", "temp", "power", "sm_clock",
           "ecc_corrected", "ecc_uncorrected", "xid")
PG_TYPES = ("bigint", "bigint", "bigint", "smallint", "smallint", "integer", "integer", "smallint", "float8",
            "smallint", "integer", "integer", "smallint")


def _store_raw(groups: list[list[tuple]]) -> list[int]:
    """One INSERT for every sender's rows; returns how many of each sender's rows were inserted. On
    PostgreSQL the columns travel as arrays (one per column) through unnest(), so the statement is the
    same size for 10 rows or 10,000 and costs no per-row SQL building; ON CONFLICT DO NOTHING makes a
    resent sample harmless. With several senders the inserted rows' GPUs say whose they were (each GPU
    is one sender's)."""
    rows = [row for group in groups for row in group]
    if not rows:
        return [0] * len(groups)
    if connection.vendor == "postgresql":
        several = sum(1 for group in groups if group) > 1
        # Array literals as text ("{1,2,NULL}"): psycopg would otherwise adapt every element.
        # Every value is a number or None, so "None" can only be a NULL.
        arrays = ["{" + ",".join(map(str, column)).replace("None", "NULL") + "}" for column in zip(*rows)]
        unnest = ", ".join(f"%s::{t}[]" for t in PG_TYPES)
        with connection.cursor() as cursor:
            cursor.execute(f"INSERT INTO {Sample._meta.db_table} ({', '.join(COLUMNS)}) "
                           f"SELECT * FROM unnest({unnest}) ON CONFLICT DO NOTHING"
                           + (" RETURNING gpu_id" if several else ""), arrays)
            if not several:
                return [cursor.rowcount if group else 0 for group in groups]
            inserted = Counter(gpu_id for (gpu_id,) in cursor.fetchall())
        return [sum(inserted.pop(gpu_id, 0) for gpu_id in {row[0] for row in group}) for group in groups]
    # SQLite (embedded): executemany's rowcount is the sum of the rows each statement inserted.
    counts = []
    with transaction.atomic(), connection.cursor() as cursor:
        for group in groups:
            if group:
                cursor.executemany(f"INSERT INTO {Sample._meta.db_table} ({', '.join(COLUMNS)}) "
                                   f"VALUES ({', '.join(['%s'] * len(COLUMNS))}) ON CONFLICT DO NOTHING", group)
            counts.append(cursor.rowcount if group else 0)
    return counts


def _mark_late_minutes(rows: list[tuple], now: float) -> None:
    """Samples for minutes the rollup may already have done (an agent resending after an outage) mark
    them dirty. The rollup does a minute GRACE seconds after it ends; 10 s of slack covers a rollup that
    read the raw table just before these rows committed. Samples on time (~1 s old) never qualify."""
    from monitoring.rollup import GRACE, MINUTE, mark_dirty

    latest_done = int(now) + 10 - GRACE[MINUTE] - MINUTE  # a minute starting at or before this may be done
    late = {minute for minute in {row[2] - row[2] % MINUTE for row in rows} if minute <= latest_done}
    if late:
        mark_dirty(late)


def _group_payloads(newest: dict[int, tuple[GpuRef, tuple]]) -> dict[str, dict]:
    """One message per group (node, pool, team) with the newest sample of each of its GPUs. A GPU held in
    shares carries each share's memory, allocated and used; a team's group gets the GPUs it holds a
    share of, with its own shares only."""
    per_group: dict[str, list] = defaultdict(list)
    t = 0.0
    for gpu_id, (ref, (ts, util, mem_util, mem_used, mem_total, temp, power, procs, uses, *health)) in newest.items():
        item = {"gpu": gpu_id, "uuid": ref.uuid, "t": ts, "util": util, "mem_util": mem_util, "mem_used": mem_used,
                "mem_total": mem_total, "temp": temp, "power": power, "processes": [list(p) for p in procs]}
        if health.count(None) < len(health):
            item.update((name, value) for name, value in zip(HEALTH_FIELDS, health) if value is not None)
        t = max(t, ts)
        if ref.holders:
            item["shares"] = _live_shares(ref.holders, uses)
        per_group[live.group_name("node", ref.node_id)].append(item)
        if ref.pool_id is not None:
            per_group[live.group_name("pool", ref.pool_id)].append(item)
        teams = {h.team_id for h in ref.holders} or ({ref.team_id} if ref.team_id is not None else set())
        for team_id in teams:
            own = item if len(teams) == 1 else {**item, "shares": [s for s in item["shares"] if s["team"] == team_id]}
            per_group[live.group_name("team", team_id)].append(own)
    return {group: {"type": "telemetry.samples", "t": t, "samples": items} for group, items in per_group.items()}


def _live_shares(holders: tuple[shares.Holder, ...], uses) -> list[dict]:
    return [{"reservation": h.reservation_id, "team": h.team_id, "instance": h.instance,
             "allocated": h.allocated_mib, "used": shares.used_mib(uses, h.reservation_id, h.instance)}
            for h in holders]
