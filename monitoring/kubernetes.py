"""Live telemetry of Kubernetes GPUs: read NVIDIA's DCGM exporter, through the cluster's Prometheus or
straight from the exporter pods, and feed what was read into the one ingest (ingest.samples_ingest).

Per cluster, staff choose the source (inventory.models.Cluster.telemetry_source):

- ``prometheus``: eight instant PromQL queries per read against the cluster's Prometheus HTTP API
  (``/api/v1/query``), whatever the fleet's size: one per DCGM field, reduced to the labels we map by
  (``max by (UUID, GPU_I_ID)``), and the time of each GPU's newest sample with the pods on it
  (``timestamp(DCGM_FI_DEV_FB_USED)`` by UUID, GPU_I_ID, namespace, pod, container, Hostname); see
  PROMETHEUS_QUERIES for why this shape.
- ``exporter``: the dcgm-exporter pods are listed through the API server by label selector and each one's
  ``/metrics`` text is read, from the pod's address or through the API server's pod proxy.

A series maps to our GPU by its ``UUID`` label (MIG instances carry ``GPU_I_ID`` too: their memory is
summed into their card's, the rest taken at its maximum), and to a workload by the exporter's
``namespace``/``pod``/``container`` labels: a namespace is a team's (allocations.apply.desired.
team_namespace), and the team's reservation on that GPU (the ingest's GPU map holds each GPU's shares)
is the one the pod's use is counted for. A pod whose team holds no share of the GPU (or whose namespace is
no team's) is "busy without a reservation": kept on the cluster's status and alerted (Metric.GPU_UNLEASED).
GPUs the inventory lacks are counted and named on the status, never dropped silently.

Prometheus answers with the newest sample of each series, which is only as new as its last scrape
(15-30 s by default): a GPU's sample is ingested once, when its timestamp moves, so a read every 5 s
stores each scrape once and the status shows the period the samples really have.
"""
from __future__ import annotations

import gc
import logging
import statistics
import time
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor, as_completed
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import timedelta
from urllib.parse import urlencode

import orjson
import urllib3
from django.conf import settings
from django.core.cache import cache
from django.db import transaction
from django.utils import timezone

from allocations.apply.desired import team_namespace
from common import crypto
from inventory.models import Cluster, TelemetrySource
from monitoring import ingest
from monitoring.models import ClusterTelemetry
from teams.models import Team

log = logging.getLogger(__name__)

# DCGM exporter field → what we keep of it.
FIELDS = {
    "DCGM_FI_DEV_GPU_UTIL": "util",  # %
    "DCGM_FI_PROF_GR_ENGINE_ACTIVE": "gr_active",  # ratio 0-1 (profiling; the only utilization of a MIG instance)
    "DCGM_FI_DEV_MEM_COPY_UTIL": "mem_util",  # %
    "DCGM_FI_DEV_FB_USED": "used",  # MiB
    "DCGM_FI_DEV_FB_FREE": "free",  # MiB
    "DCGM_FI_DEV_FB_RESERVED": "reserved",  # MiB
    "DCGM_FI_DEV_POWER_USAGE": "power",  # W
    "DCGM_FI_DEV_GPU_TEMP": "temp",  # °C
    "DCGM_FI_DEV_XID_ERRORS": "xid",  # the last XID error's code
}
# The series whose timestamp dates a GPU's sample and whose labels name the pods on it: every GPU and
# every MIG instance has one.
DATING_FIELD = "DCGM_FI_DEV_FB_USED"
# What the prometheus source asks, one instant query per field, run a few at a time (Prometheus
# evaluates them on its cores at once). One query per field, reduced to the labels we map by, is the
# cheapest shape we measured at 10,000 GPUs: one regex selector over all fields grouped by __name__
# cost Prometheus about twice as much for the same series, and asking with every label made the
# answer three times larger to send and decode. The card's total memory comes from the inventory
# (discovery reads it from the node's GFD labels), not from FB_FREE + FB_RESERVED each read: it does
# not change, and two fewer fields are a third fewer series. The XID and GR-engine fields are asked
# only where they say something (an XID error; a MIG instance, which has no GPU_UTIL), so they cost
# next to nothing on a healthy fleet without MIG.
PROMETHEUS_QUERIES = {
    key: f"max by (UUID, GPU_I_ID) ({expr})" for key, expr in (
        ("util", "DCGM_FI_DEV_GPU_UTIL"),
        ("mem_util", "DCGM_FI_DEV_MEM_COPY_UTIL"),
        ("used", "DCGM_FI_DEV_FB_USED"),
        ("power", "DCGM_FI_DEV_POWER_USAGE"),
        ("temp", "DCGM_FI_DEV_GPU_TEMP"),
        ("xid", "DCGM_FI_DEV_XID_ERRORS != 0"),
        ("gr_active", 'DCGM_FI_PROF_GR_ENGINE_ACTIVE{GPU_I_ID!=""}'),
    )
}
PODS_QUERY = (f"max by (UUID, GPU_I_ID, Hostname, namespace, pod, container, exported_namespace, exported_pod, "
              f"exported_container) (timestamp({DATING_FIELD}))")
QUERIES_AT_ONCE = 4
UNKNOWN_EXAMPLES = 20
UNLEASED_KEPT = 200
SEEN_TTL = 3600

_http = urllib3.PoolManager(num_pools=32, maxsize=16, retries=False)


class ReadFailed(Exception):
    """The source could not be read: the message says why, in words staff can act on."""


@dataclass
class Reading:
    """What one read found: per GPU UUID its values, per (UUID, GPU instance) the sample time and pods."""

    series: int = 0
    # uuid → gpu instance id ("" for the card) → field → value
    values: dict[str, dict[str, dict[str, float]]] = field(default_factory=lambda: defaultdict(dict))
    # uuid → sample time (epoch seconds)
    ts: dict[str, float] = field(default_factory=dict)
    # uuid → [(namespace, pod, container, gpu instance id)]
    pods: dict[str, list[tuple[str, str, str, str]]] = field(default_factory=lambda: defaultdict(list))
    hostname: dict[str, str] = field(default_factory=dict)
    # The exporter pods' own namespace (Cluster.exporter_namespace): see add_dating.
    exporter_namespace: str = ""

    def add_value(self, key: str | None, labels: dict, value: float) -> None:
        uuid = labels.get("UUID")
        if key is None or not uuid or value != value:  # NaN: a field DCGM could not read
            return
        self.values[uuid].setdefault(labels.get("GPU_I_ID", ""), {})[key] = value

    def add_dating(self, labels: dict, ts: float) -> None:
        uuid = labels.get("UUID")
        if not uuid:
            return
        if ts > self.ts.get(uuid, 0.0):
            self.ts[uuid] = ts
        if labels.get("Hostname"):
            self.hostname[uuid] = labels["Hostname"]
        # The workload on the GPU. Scraped with honor_labels false (the Prometheus Operator's default for a
        # ServiceMonitor), the exporter's namespace/pod/container labels arrive renamed exported_*, and
        # namespace/pod name the exporter pod itself: the exported_* ones are read first, and the
        # exporter's own namespace, where staff named it, is never a workload's.
        if labels.get("exported_pod"):
            namespace, pod, container = (labels.get("exported_namespace", ""), labels["exported_pod"],
                                         labels.get("exported_container", ""))
        elif labels.get("pod") and not (self.exporter_namespace
                                        and labels.get("namespace") == self.exporter_namespace):
            namespace, pod, container = labels.get("namespace", ""), labels["pod"], labels.get("container", "")
        else:
            return
        self.pods[uuid].append((namespace, pod, container, labels.get("GPU_I_ID", "")))


# --- reading the sources ---------------------------------------------------------------------------

def _prometheus_headers(cluster: Cluster) -> dict[str, str]:
    headers = {"Accept": "application/json"}
    if cluster.prometheus_auth_encrypted:
        try:
            secret = orjson.loads(crypto.decrypt(cluster.prometheus_auth_encrypted))
        except crypto.DecryptionFailed as exc:
            raise ReadFailed(f"the Prometheus credentials cannot be decrypted ({exc})") from exc
        if secret.get("bearer_token"):
            headers["Authorization"] = f"Bearer {secret['bearer_token']}"
        elif secret.get("username"):
            headers.update(urllib3.make_headers(basic_auth=f"{secret['username']}:{secret['password']}"))
    return headers


def prometheus_query(cluster: Cluster, query: str) -> list[dict]:
    """One instant query; its result vector. ReadFailed says why it failed."""
    url = cluster.prometheus_url.rstrip("/") + "/api/v1/query?" + urlencode({"query": query})
    timeout = settings.TELEMETRY_K8S_TIMEOUT_SECONDS
    try:
        response = _http.request("GET", url, headers=_prometheus_headers(cluster),
                                 timeout=urllib3.Timeout(connect=min(2.0, timeout), read=timeout))
    except urllib3.exceptions.HTTPError as exc:
        raise ReadFailed(f"Prometheus at {cluster.prometheus_url} is unreachable ({exc.__class__.__name__}: "
                         f"{str(exc)[:300]})") from exc
    if response.status in (401, 403):
        raise ReadFailed(f"Prometheus refused the credentials ({response.status})")
    try:
        body = orjson.loads(response.data)
    except orjson.JSONDecodeError:
        raise ReadFailed(f"Prometheus answered {response.status} with something that is not its JSON API "
                         f"(is {cluster.prometheus_url} a Prometheus?)") from None
    if response.status != 200 or not isinstance(body, dict) or body.get("status") != "success":
        error = body.get("error") if isinstance(body, dict) else None
        raise ReadFailed(f"Prometheus answered {response.status}: {error or 'no result'}")
    data = body.get("data") or {}
    if data.get("resultType") != "vector":
        raise ReadFailed(f"Prometheus answered a {data.get('resultType')!r}, not a vector")
    return data.get("result") or []


def read_prometheus(cluster: Cluster) -> Reading:
    queries = {**PROMETHEUS_QUERIES, "": PODS_QUERY}
    reading = Reading(exporter_namespace=cluster.exporter_namespace)
    values = reading.values
    with ThreadPoolExecutor(max_workers=QUERIES_AT_ONCE) as pool:
        futures = {pool.submit(prometheus_query, cluster, query): key for key, query in queries.items()}
        # Each answer is taken in as it comes, while Prometheus still evaluates the others.
        for future in as_completed(futures):
            key, result = futures[future], future.result()
            reading.series += len(result)
            if key == "":
                for item in result:
                    reading.add_dating(item["metric"], float(item["value"][1]))
                continue
            # add_value, inlined: this loop runs once per series (60,000 times a read at 10,000 GPUs).
            for item in result:
                labels = item["metric"]
                uuid = labels.get("UUID")
                value = float(item["value"][1])
                if uuid and value == value:  # NaN: a field DCGM could not read
                    values[uuid].setdefault(labels.get("GPU_I_ID", ""), {})[key] = value
    return reading


def _exporter_targets(cluster: Cluster) -> list[tuple[str, str, str]]:
    """(namespace, pod name, pod IP) of each running dcgm-exporter pod, listed through the API server."""
    from kubernetes import client as k8s

    from inventory.kubernetes.client import ClusterError, call, connect

    try:
        with connect(cluster) as api:
            core = k8s.CoreV1Api(api)
            kwargs = {"label_selector": cluster.exporter_selector, "_preload_content": False}
            if cluster.exporter_namespace:
                response = call(core.list_namespaced_pod, cluster.exporter_namespace, **kwargs)
            else:
                response = call(core.list_pod_for_all_namespaces, **kwargs)
            items = orjson.loads(response.data).get("items") or []
    except ClusterError as exc:
        raise ReadFailed(f"listing the exporter pods failed: {exc.message}") from exc
    targets = []
    for item in items:
        meta, status = item.get("metadata") or {}, item.get("status") or {}
        if status.get("phase") == "Running" and (status.get("podIP") or cluster.exporter_via_proxy):
            targets.append((meta.get("namespace", ""), meta.get("name", ""), status.get("podIP", "")))
    return targets


def _scrape_direct(cluster: Cluster, target: tuple[str, str, str]) -> bytes:
    _, name, ip = target
    host = f"[{ip}]" if ":" in ip else ip
    try:
        response = _http.request("GET", f"http://{host}:{cluster.exporter_port}/metrics",
                                 timeout=settings.TELEMETRY_K8S_TIMEOUT_SECONDS)
    except urllib3.exceptions.HTTPError as exc:
        raise ReadFailed(f"exporter pod {name} ({ip}) is unreachable ({exc.__class__.__name__})") from exc
    if response.status != 200:
        raise ReadFailed(f"exporter pod {name} answered {response.status}")
    return response.data


def _scrape_proxy(cluster: Cluster, target: tuple[str, str, str]) -> bytes:
    from kubernetes import client as k8s

    from inventory.kubernetes.client import ClusterError, call, connect

    namespace, name, _ = target
    try:
        with connect(cluster) as api:
            response = call(k8s.CoreV1Api(api).connect_get_namespaced_pod_proxy_with_path,
                            f"{name}:{cluster.exporter_port}", namespace, "metrics", _preload_content=False)
            return response.data
    except ClusterError as exc:
        raise ReadFailed(f"exporter pod {namespace}/{name} through the API server's proxy: {exc.message}") from exc


def parse_exporter_text(text: str, reading: Reading, ts: float) -> None:
    """The exporter's text format (Prometheus exposition, no timestamps: the read's time dates it)."""
    from prometheus_client.parser import text_string_to_metric_families

    for family in text_string_to_metric_families(text):
        if family.name not in FIELDS:
            continue
        for sample in family.samples:
            reading.series += 1
            reading.add_value(FIELDS[sample.name], sample.labels, sample.value)
            if sample.name == DATING_FIELD:
                reading.add_dating(sample.labels, ts)


def read_exporter(cluster: Cluster) -> Reading:
    targets = _exporter_targets(cluster)
    if not targets:
        raise ReadFailed(f"no running exporter pod matches {cluster.exporter_selector!r}"
                         + (f" in namespace {cluster.exporter_namespace}" if cluster.exporter_namespace else ""))
    scrape = _scrape_proxy if cluster.exporter_via_proxy else _scrape_direct
    # Read straight from the exporter, namespace/pod/container are the workload's (no scraper renamed them).
    reading, failed = Reading(), []
    with ThreadPoolExecutor(max_workers=min(16, len(targets))) as pool:
        futures = [(target, pool.submit(scrape, cluster, target)) for target in targets]
        for target, future in futures:
            try:
                body = future.result()
            except ReadFailed as exc:
                failed.append(str(exc))
                continue
            parse_exporter_text(body.decode("utf-8", "replace"), reading, time.time())
    if failed and len(failed) == len(targets):
        raise ReadFailed("; ".join(failed[:3]))
    if failed:
        log.warning("cluster %s: %d of %d exporter pods unread: %s", cluster.slug, len(failed), len(targets),
                    "; ".join(failed[:3]))
    return reading


READERS = {TelemetrySource.PROMETHEUS: read_prometheus, TelemetrySource.EXPORTER: read_exporter}


# --- from a reading to the ingest -----------------------------------------------------------------

@dataclass
class Outcome:
    samples: list[ingest.WireSample] = field(default_factory=list)
    times: list[float] = field(default_factory=list)  # each sample's time, in the same order
    periods: list[float] = field(default_factory=list)  # how far each GPU's sample is from its previous one
    unknown: dict[str, str] = field(default_factory=dict)  # uuid → hostname
    unleased: list[dict] = field(default_factory=list)


def team_namespaces() -> dict[str, tuple[int, str]]:
    """namespace → (team id, slug) of every team (cached as briefly as the ingest's GPU maps)."""
    found = cache.get("tm:k8s:namespaces")
    if found is None:
        found = {team_namespace(slug): (pk, slug) for pk, slug in Team.objects.values_list("pk", "slug")}
        cache.set("tm:k8s:namespaces", found, ingest.HOST_MAP_TTL)
    return found


def _gpu_values(instances: dict[str, dict[str, float]]) -> dict[str, float]:
    """One card's values: the card's own series, or with MIG its instances' (memory summed, the rest at most)."""
    if "" in instances and len(instances) == 1:
        return instances[""]
    parts = [v for gi, v in instances.items() if gi] or list(instances.values())
    out: dict[str, float] = {}
    for part in parts:
        for key, value in part.items():
            out[key] = out.get(key, 0.0) + value if key in ("used", "free", "reserved") else max(out.get(key, value),
                                                                                                    value)
    return out


def outcome_of(reading: Reading, refs: dict[str, ingest.GpuRef], seen: dict[str, float],
               namespaces: dict[str, tuple[int, str]], node_names: dict[int, str],
               memory: dict[str, int]) -> Outcome:
    """The samples to ingest (each GPU's newer than the one `seen` last), the pods' attribution and what is unknown."""
    out = Outcome()
    for uuid, instances in reading.values.items():
        ref = refs.get(uuid)
        if ref is None:
            out.unknown[uuid] = reading.hostname.get(uuid, "")
            continue
        v = _gpu_values(instances)
        used = v.get("used", 0.0)
        # Every read names the pods on every GPU, whether or not its sample is new, so the "without a
        # reservation" list does not come and go between scrapes.
        processes = _attribute(reading.pods.get(uuid, ()), ref, used, namespaces, node_names, out.unleased)
        ts = reading.ts.get(uuid)
        if ts is None or ts <= seen.get(uuid, 0.0):
            continue  # no newer scrape of this GPU since the last read
        if "used" not in v or "temp" not in v:
            continue  # a GPU without memory or temperature fields: nothing we can chart
        util = v["util"] if "util" in v else 100.0 * v.get("gr_active", 0.0)
        total = used + v["free"] + v.get("reserved", 0.0) if "free" in v else memory.get(uuid) or used
        out.samples.append(ingest.WireSample(
            uuid=uuid, utilization_gpu_pct=util, memory_used_mib=used, memory_total_mib=total,
            temperature_c=v["temp"], utilization_memory_pct=v.get("mem_util", 0.0), power_w=v.get("power", 0.0),
            processes=processes, xid=int(v["xid"]) if "xid" in v else None))
        out.times.append(ts)
        if uuid in seen:
            out.periods.append(ts - seen[uuid])
        seen[uuid] = ts
    return out


def _attribute(pods, ref: ingest.GpuRef, used: float, namespaces, node_names, unleased: list) -> list:
    """The pods on one GPU as the ingest's processes, each named by its team's holder (so monitoring.shares
    counts its memory for that reservation); a pod whose team holds no share of the GPU goes to `unleased`.
    DCGM reports memory per card (or MIG instance), not per pod: pods sharing one split it evenly."""
    if not pods:
        return []
    held = {h.team_id: h for h in ref.holders}
    mine = []
    for namespace, pod, container, gi in pods:
        team = namespaces.get(namespace)
        holder = held.get(team[0]) if team else None
        if holder is None:
            unleased.append({"gpu": ref.gpu_id, "uuid": ref.uuid, "node": node_names.get(ref.node_id, ""),
                             "namespace": namespace, "pod": pod, "container": container,
                             "team": team[1] if team else None, "team_id": team[0] if team else None})
            continue
        mine.append((holder, gi))
    share = int(used // len(pods))
    return [ingest.WireProcess(pid=0, used_memory_mib=share, user=holder.user,
                               gpu_instance_id=int(gi) if gi.isdigit() else None)
            for holder, gi in mine]


def _batches(samples: list[ingest.WireSample], times: list[float]) -> list[ingest.WireBatch]:
    """One batch per second of sample time (the ingest dates a batch, not a sample)."""
    by_second: dict[int, list] = defaultdict(list)
    first: dict[int, float] = {}
    for sample, ts in zip(samples, times):
        second = int(ts)
        by_second[second].append(sample)
        first.setdefault(second, ts)
    return [ingest.WireBatch(seq=0, t=first[s], gpus=gpus) for s, gpus in sorted(by_second.items())]


def _gpu_memory(cluster_id: int) -> dict[str, int]:
    """uuid → the card's memory in MiB, as the inventory has it (cached as briefly as the GPU maps)."""
    from inventory.models import Gpu

    key = f"tm:k8s:memory:{cluster_id}"
    found = cache.get(key)
    if found is None:
        found = dict(Gpu.objects.filter(node__cluster_id=cluster_id).values_list("uuid", "memory_mib"))
        cache.set(key, found, ingest.HOST_MAP_TTL)
    return found


def _node_names(cluster_id: int) -> dict[int, str]:
    from inventory.models import Node

    return dict(Node.objects.filter(cluster_id=cluster_id).values_list("pk", "name"))


def cluster_telemetry_read(*, cluster: Cluster, now: float | None = None) -> ClusterTelemetry:
    """Read one cluster's telemetry once, ingest what is new and record how it went on its status row."""
    with _gc_paused():
        return _read(cluster, now)


@contextmanager
def _gc_paused():
    """A read at 10,000 GPUs decodes ~70,000 small dicts from Prometheus's JSON and makes as many tuples;
    each allocation burst triggered collections that scanned all of them, for nothing (none is in a
    cycle: refcounting frees them). Paused for the read, it took about half the CPU (measured at 10,000
    GPUs: 0.30 against 0.56-0.91 s). Whatever cycle someone else makes meanwhile is collected after."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def _read(cluster: Cluster, now: float | None) -> ClusterTelemetry:
    started = time.monotonic()
    now = time.time() if now is None else now
    at = timezone.now()
    status = _status_row(cluster, at)
    reader = READERS.get(cluster.telemetry_source)
    if reader is None:
        return status
    seen_key = f"tm:k8s:seen:{cluster.pk}"
    # The maps the reading is matched against are fetched while the source is read (mostly waiting on
    # Prometheus or the exporters), not after it.
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="k8s-read") as pool:
        reading_of = pool.submit(reader, cluster)
        seen = cache.get(seen_key) or {}
        refs = ingest.cluster_gpus(cluster.pk)
        maps = (team_namespaces(), _node_names(cluster.pk), _gpu_memory(cluster.pk))
        try:
            reading = reading_of.result()
        except ReadFailed as exc:
            return _record_failure(status, str(exc), at)
    read_at = time.monotonic()
    unleased_before = status.unleased
    outcome = outcome_of(reading, refs, seen, *maps)
    mapped_at = time.monotonic()
    result = ingest.samples_ingest(refs=refs, batches=_batches(outcome.samples, outcome.times), now=now,
                                   who=f"Kubernetes cluster {cluster.slug} ({cluster.telemetry_source})")
    cache.set(seen_key, seen, SEEN_TTL)
    # Where a read's time went (not stored: the benchmark reports it).
    status.stages = {"read_s": round(read_at - started, 3), "map_s": round(mapped_at - read_at, 3),
                     "ingest_s": round(time.monotonic() - mapped_at, 3)}
    lags = [now - t for t in reading.ts.values()]
    fields = {
        "source": cluster.telemetry_source, "last_attempt_at": at, "last_success_at": at, "error": "",
        "read_seconds": round(time.monotonic() - started, 3), "series_read": reading.series,
        "gpus_read": len(reading.values), "samples_ingested": result.accepted,
        "lag_seconds": round(statistics.median(lags), 2) if lags else None,
        "unknown_gpus": len(outcome.unknown),
        "unknown_examples": [{"uuid": u, "hostname": h} for u, h in sorted(outcome.unknown.items())[:UNKNOWN_EXAMPLES]],
        "unleased": outcome.unleased[:UNLEASED_KEPT],
    }
    if outcome.periods:
        fields["sample_period_seconds"] = round(statistics.median(outcome.periods), 2)
    ClusterTelemetry.objects.filter(pk=status.pk).update(**fields)
    for key, value in fields.items():
        setattr(status, key, value)
    _log_unleased(cluster, unleased_before, outcome.unleased)
    return status


def _log_unleased(cluster: Cluster, before: list, now: list) -> None:
    def keys(items):
        return sorted({(i["uuid"], i["namespace"], i["pod"]) for i in items})

    if now and keys(now) != keys(before):
        log.warning("cluster %s: pods on GPUs their team holds no reservation on: %s", cluster.slug,
                    ", ".join(f"{ns}/{pod} on {uuid}" for uuid, ns, pod in keys(now)[:10]))


def _status_row(cluster: Cluster, at) -> ClusterTelemetry:
    status, _ = ClusterTelemetry.objects.get_or_create(
        cluster=cluster, defaults={"source": cluster.telemetry_source, "since": at, "next_read_at": at})
    return status


def _record_failure(status: ClusterTelemetry, error: str, at) -> ClusterTelemetry:
    log.warning("telemetry of cluster %s: %s", status.cluster.slug, error)
    ClusterTelemetry.objects.filter(pk=status.pk).update(
        last_attempt_at=at, error=error[:2000], errors_total=status.errors_total + 1,
        source=status.cluster.telemetry_source)
    status.refresh_from_db()
    return status


# --- scheduling -------------------------------------------------------------------------------------

def clusters_due(*, now=None) -> list[int]:
    """Claim every cluster whose read is due (a conditional update, so one tick's claim is the only one):
    returns their ids, to read one task each."""
    now = now or timezone.now()
    due = []
    clusters = Cluster.objects.filter(kind=Cluster.Kind.KUBERNETES).exclude(telemetry_source=TelemetrySource.NONE)
    for cluster in clusters:
        status = _status_row(cluster, now)
        if status.next_read_at > now:
            continue
        period = timedelta(seconds=cluster.telemetry_period_seconds)
        # The next read is due a period after this one was due (not after now): reads keep their rhythm.
        next_at = max(status.next_read_at + period, now + period * 0.5)
        with transaction.atomic():
            claimed = ClusterTelemetry.objects.filter(pk=status.pk, next_read_at=status.next_read_at).update(
                next_read_at=next_at)
        if claimed:
            due.append(cluster.pk)
    # Rows of clusters that no longer read telemetry go: their status (and silence) is over.
    ClusterTelemetry.objects.exclude(cluster__in=clusters).delete()
    return due


def silent_after(cluster: Cluster) -> float:
    """Seconds without a successful read after which a cluster's telemetry counts as silent."""
    return max(settings.TELEMETRY_K8S_SILENT_SECONDS, 3 * cluster.telemetry_period_seconds)
