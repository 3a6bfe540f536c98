"""The Kubernetes apply backend: namespaces, GPU ResourceQuotas and sharing config, by server-side apply.

``KubernetesBackend(cluster).sync(desired, teams=...)`` makes the cluster match
``desired`` (see :mod:`allocations.apply.backends.kubernetes_manifests` for the objects):

- for each named team (every team when ``teams`` is None): its namespace and its
  ResourceQuota, capped at what it holds now;
- for the pools: the device-plugin ConfigMap (time-slicing/MPS replicas, the MIG strategy; and
  the mig-parted one for layouts of the portal's own)
  in the system namespace, and the sharing labels on the pools' nodes (never creating a
  node; a missing one is reported);
- reconcile (``teams=None``) also zeroes the quota of every portal-managed namespace whose
  team is no longer in ``desired`` (namespaces are never deleted: the team's workloads and
  secrets live there) and removes the portal's labels from nodes that left a shared pool.

A quota binds pods only once the cluster's quota controller has copied its limits into
``status.hard``; sync waits for that (up to ``quota_wait_seconds``) and raises
:class:`BackendPending` if it does not happen, so "applied" means "enforced".

Each object is read first and applied only when a field the portal owns differs, so a
second sync with the same ``desired`` sends nothing and reports no change. Writes are
server-side apply with field manager ``gpupool-portal`` and ``force`` (the portal's
values win over a hand edit of the same field). Errors: unreachable server, 409, 429 and
5xx raise :class:`BackendError` (retried); bad credentials, 401/403 (RBAC), TLS failures
and other 4xx raise :class:`BackendRejected`.
"""
from __future__ import annotations

import json
import logging
import time
from collections.abc import Collection
from typing import Any

from kubernetes import client as k8s

from allocations.apply.backends import kubernetes_manifests as m
from allocations.apply.backends.base import BackendError, BackendPending, BackendRejected, SyncReport
from allocations.apply.desired import (
    FIELD_MANAGER,
    MANAGED_BY_LABEL,
    MANAGED_BY_VALUE,
    TEAM_LABEL,
    ClusterDesired,
    TeamDesired,
)
from inventory.kubernetes.client import ClusterError, call, connect
from inventory.kubernetes.nodes import parse_quantity

log = logging.getLogger(__name__)

APPLY_PATCH = "application/apply-patch+yaml"


def _raise_backend(error: ClusterError, what: str) -> None:
    message = f"{what}: {error.message}"
    if error.retryable:
        raise BackendError(message) from error
    raise BackendRejected(message) from error


def _fmt(values: dict[str, Any]) -> str:
    return ", ".join(f"{k}={v}" for k, v in sorted(values.items())) or "nothing"


class _Kind:
    """How to read and apply one kind of object through the typed CoreV1Api."""

    def __init__(self, read: str, patch: str, namespaced: bool) -> None:
        self.read, self.patch, self.namespaced = read, patch, namespaced


_KINDS = {
    "Namespace": _Kind("read_namespace", "patch_namespace", False),
    "ResourceQuota": _Kind("read_namespaced_resource_quota", "patch_namespaced_resource_quota", True),
    "ConfigMap": _Kind("read_namespaced_config_map", "patch_namespaced_config_map", True),
    "Node": _Kind("read_node", "patch_node", False),
}


class KubernetesBackend:
    name = "kubernetes"
    reads_pools = True  # the sharing ConfigMaps and node labels; every team's ResourceQuota

    #: How long one sync waits for the quota controller to count a new or changed ResourceQuota before it says
    #: BackendPending (the lifecycle retries it).
    QUOTA_WAIT_SECONDS = 5.0

    def __init__(self, cluster: Any, *, system_namespace: str = m.SYSTEM_NAMESPACE,
                 quota_wait_seconds: float | None = None) -> None:
        self.cluster = cluster
        self.system_namespace = system_namespace
        self.quota_wait_seconds = self.QUOTA_WAIT_SECONDS if quota_wait_seconds is None else quota_wait_seconds
        # Every manifest sent in the last sync (tests validate them against the schema).
        self.sent: list[dict] = []
        self._prefetched: dict[tuple[str, str, str], dict] = {}

    # --- the contract ---------------------------------------------------------------------------

    def sync(self, desired: ClusterDesired, *, teams: Collection[str] | None = None) -> SyncReport:
        reconcile = teams is None
        team_list = list(desired.teams) if reconcile else [desired.team(slug) for slug in sorted(set(teams))]
        target = f"kubernetes cluster {desired.cluster_slug}"
        if not reconcile:
            target += f" (namespace{'s' if len(team_list) != 1 else ''} {', '.join(t.namespace for t in team_list)})"
        report = SyncReport(target=target)
        self.sent = []
        try:
            with connect(self.cluster) as api:
                core = k8s.CoreV1Api(api)
                # Reconcile reads every managed namespace and quota in two LISTs instead of two
                # GETs per team; an object missing from them is still read on its own.
                self._prefetched = self._prefetch(core) if reconcile else {}
                for team in team_list:
                    self._sync_team(core, team, desired, report)
                if reconcile:
                    self._zero_forgotten_teams(core, desired, report)
                self._sync_pools(core, desired, report, reconcile=reconcile)
        except ClusterError as error:
            _raise_backend(error, f"{target}")
        return report

    # --- teams ----------------------------------------------------------------------------------

    def _sync_team(self, core: k8s.CoreV1Api, team: TeamDesired, desired: ClusterDesired,
                   report: SyncReport) -> None:
        self._ensure(core, m.namespace_manifest(team), report)
        quota = m.quota_manifest(team, desired.pools)
        live = self._ensure(core, quota, report)
        self._wait_enforced(core, quota, live)

    def _wait_enforced(self, core: k8s.CoreV1Api, quota: dict, live: dict | None) -> None:
        """Return once the quota controller has taken the quota's hard limits into its status.

        Admission checks pods against ``status.hard``, so a new or changed quota binds only
        after the controller has counted it (usually well under a second). Until then the
        change is not in force: BackendPending, which the lifecycle retries.
        """
        want = {k: parse_quantity(v) for k, v in quota["spec"]["hard"].items()}

        def enforced(obj: dict | None) -> bool:
            hard = ((obj or {}).get("status") or {}).get("hard") or {}
            return all(parse_quantity(hard.get(k)) == v and k in hard for k, v in want.items())

        if enforced(live):
            return
        deadline = time.monotonic() + self.quota_wait_seconds
        while True:
            if enforced(self._read(core, quota)):
                return
            if time.monotonic() >= deadline:
                raise BackendPending(f"{self._name(quota)} is applied but not enforced yet: the cluster's quota "
                                     f"controller has not counted it after {self.quota_wait_seconds:g} s")
            time.sleep(0.05)

    def _zero_forgotten_teams(self, core: k8s.CoreV1Api, desired: ClusterDesired, report: SyncReport) -> None:
        known = {team.namespace for team in desired.teams}
        selector = f"{MANAGED_BY_LABEL}={MANAGED_BY_VALUE},{TEAM_LABEL}"
        listed = self._json(call(core.list_namespace, label_selector=selector, _preload_content=False))
        for item in listed.get("items") or []:
            metadata = item.get("metadata") or {}
            if metadata.get("name") in known or (metadata.get("deletionTimestamp")):
                continue
            slug = (metadata.get("labels") or {}).get(TEAM_LABEL, "")
            team = TeamDesired(team_slug=slug)
            if team.namespace != metadata.get("name"):
                log.warning("namespace %s carries team label %s of another namespace; skipped",
                            metadata.get("name"), slug)
                continue
            self._sync_team(core, team, desired, report)

    # --- pools ----------------------------------------------------------------------------------

    def _sync_pools(self, core: k8s.CoreV1Api, desired: ClusterDesired, report: SyncReport, *,
                    reconcile: bool) -> None:
        shared = [p for p in desired.pools if m.configures_device_plugin(p)]
        mig_parted = m.mig_parted_configmap_manifest(desired.pools, self.system_namespace)
        wanted = m.node_labels(desired.pools)
        if shared or mig_parted:
            self._ensure(core, m.system_namespace_manifest(self.system_namespace), report)
        if shared or reconcile:
            # With no shared or MIG pool left, reconcile still empties an existing ConfigMap (never creates one).
            self._ensure(core, m.device_plugin_configmap_manifest(desired.pools, self.system_namespace), report,
                         create=bool(shared))
        if mig_parted:
            self._ensure(core, mig_parted, report)
        elif reconcile:
            self._ensure(core, m.mig_parted_configmap_manifest([], self.system_namespace, empty=True), report,
                         create=False)
        for node, labels in sorted(wanted.items()):
            self._ensure(core, m.node_manifest(node, labels), report, create=False)
        if reconcile:
            listed = self._json(call(core.list_node, label_selector=m.POOL_LABEL, _preload_content=False))
            for item in listed.get("items") or []:
                name = (item.get("metadata") or {}).get("name")
                if name and name not in wanted:
                    self._ensure(core, m.node_manifest(name, {}), report, create=False, live=item)

    # --- reading, comparing, applying -----------------------------------------------------------

    @staticmethod
    def _json(response: Any) -> dict:
        try:
            return json.loads(response.data)
        except (ValueError, AttributeError) as exc:
            raise ClusterError("the API server sent an answer that is not JSON", kind="server",
                               retryable=True) from exc

    def _prefetch(self, core: k8s.CoreV1Api) -> dict[tuple[str, str, str], dict]:
        selector = f"{MANAGED_BY_LABEL}={MANAGED_BY_VALUE}"
        found: dict[tuple[str, str, str], dict] = {}
        for kind, listing in (("Namespace", core.list_namespace),
                              ("ResourceQuota", core.list_resource_quota_for_all_namespaces)):
            for item in self._json(call(listing, label_selector=selector, _preload_content=False)).get("items") or []:
                metadata = item.get("metadata") or {}
                found[(kind, metadata.get("namespace", ""), metadata.get("name", ""))] = item
        return found

    def _read(self, core: k8s.CoreV1Api, manifest: dict) -> dict | None:
        kind = _KINDS[manifest["kind"]]
        metadata = manifest["metadata"]
        # Taken once: a second read of the same object (waiting for the quota) asks the API server.
        cached = self._prefetched.pop((manifest["kind"], metadata.get("namespace", ""), metadata["name"]), None)
        if cached is not None:
            return cached
        args = (metadata["name"], metadata["namespace"]) if kind.namespaced else (metadata["name"],)
        try:
            return self._json(call(getattr(core, kind.read), *args, _preload_content=False))
        except ClusterError as error:
            if error.kind == "not_found":
                return None
            raise

    def _apply(self, core: k8s.CoreV1Api, manifest: dict) -> None:
        kind = _KINDS[manifest["kind"]]
        metadata = manifest["metadata"]
        args = (metadata["name"], metadata["namespace"]) if kind.namespaced else (metadata["name"],)
        self.sent.append(manifest)
        call(getattr(core, kind.patch), *args, manifest, field_manager=FIELD_MANAGER, force=True,
             _content_type=APPLY_PATCH, _preload_content=False)

    def _ensure(self, core: k8s.CoreV1Api, manifest: dict, report: SyncReport, *, create: bool = True,
                live: dict | None = None) -> dict | None:
        """Apply `manifest` if the live object is missing or differs in a field the portal owns.

        Returns the live object when nothing was sent, None after an apply (or a skip)."""
        live = live if live is not None else self._read(core, manifest)
        what = self._name(manifest)
        if live is None:
            if not create:
                if manifest["kind"] == "Node":  # a pool lists a node the API server does not know
                    log.warning("%s not found on cluster %s; not created", what, getattr(self.cluster, "slug", "?"))
                return None
            self._apply(core, manifest)
            report.changes.append(f"created {what}{self._summary(manifest)}")
            return None
        differences = self._differences(manifest, live)
        if differences:
            self._apply(core, manifest)
            report.changes.append(f"updated {what}: {'; '.join(differences)}")
            return None
        return live

    @staticmethod
    def _name(manifest: dict) -> str:
        metadata = manifest["metadata"]
        name = f"{metadata['namespace']}/{metadata['name']}" if "namespace" in metadata else metadata["name"]
        return f"{manifest['kind']} {name}"

    @staticmethod
    def _summary(manifest: dict) -> str:
        if manifest["kind"] == "ResourceQuota":
            return " with " + _fmt(manifest["spec"]["hard"])
        if manifest["kind"] == "ConfigMap":
            return " with " + ", ".join(sorted(manifest["data"]))
        return ""

    @staticmethod
    def _differences(manifest: dict, live: dict) -> list[str]:
        """What applying `manifest` would change: a value the portal wants that differs, or a
        key the portal owns (server-side apply's managedFields) that it no longer wants."""
        out: list[str] = []
        sections: list[tuple[str, dict, dict, tuple[str, ...]]] = [
            ("label", manifest["metadata"].get("labels") or {}, (live.get("metadata") or {}).get("labels") or {},
             ("metadata", "labels")),
            ("annotation", manifest["metadata"].get("annotations") or {},
             (live.get("metadata") or {}).get("annotations") or {}, ("metadata", "annotations")),
        ]
        if manifest["kind"] == "ResourceQuota":
            sections.append(("", manifest["spec"]["hard"], (live.get("spec") or {}).get("hard") or {},
                             ("spec", "hard")))
        if manifest["kind"] == "ConfigMap":
            sections.append(("data", manifest["data"], live.get("data") or {}, ("data",)))
        for word, want, have, path in sections:
            prefix = f"{word} " if word else ""
            for key in sorted(set(want) | (_owned(live, path) - set(want))):
                before, after = have.get(key), want.get(key)
                if key in want and _same(manifest["kind"], path, before, after):
                    continue
                if key not in want and before is None:
                    continue
                if word == "data":
                    out.append(f"data {key} {'added' if before is None else 'removed' if after is None else 'changed'}")
                else:
                    out.append(f"{prefix}{key} {'unset' if before is None else before} → "
                               f"{'unset' if after is None else after}")
        return out


def _same(kind: str, path: tuple[str, ...], before: Any, after: Any) -> bool:
    if before is None:
        return False
    if path == ("spec", "hard"):
        return parse_quantity(before) == parse_quantity(after)
    return before == after


def _owned(live: dict, path: tuple[str, ...]) -> set[str]:
    """Keys under `path` that the portal's field manager owns through apply, from managedFields."""
    keys: set[str] = set()
    for entry in (live.get("metadata") or {}).get("managedFields") or []:
        if entry.get("manager") != FIELD_MANAGER or entry.get("operation") != "Apply":
            continue
        node = entry.get("fieldsV1") or {}
        for part in path:
            node = node.get(f"f:{part}") or {}
        keys |= {key[2:] for key in node if key.startswith("f:")}
    return keys
