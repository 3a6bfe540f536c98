"""The Kubernetes objects the portal manages, as plain dicts built from the desired state. Pure functions.

Per team: a Namespace (``team_namespace(slug)``) and a ResourceQuota ``gpupool`` in it whose
``spec.hard`` caps the team's GPU requests at what it holds right now, for every GPU
resource name used on the cluster (0 for what it does not hold, so an unreserved pool is
closed to it). Resource names per sharing mode:

=============  =================================================================
exclusive      ``nvidia.com/gpu`` (whole GPUs)
time_slicing   ``nvidia.com/gpu.shared`` (the device plugin runs with renameByDefault)
mps            ``nvidia.com/gpu.shared`` (idem)
mig            ``nvidia.com/mig-<profile>`` (mixed strategy)
vgpu (HAMi)    ``nvidia.com/gpu`` (vGPU slots), ``nvidia.com/gpumem`` (MiB), ``nvidia.com/gpucores`` (%)
=============  =================================================================

Per pool that needs node configuration: time_slicing and mps pools get an entry in the
device-plugin ConfigMap and the ``nvidia.com/device-plugin.config`` label on their nodes;
mig pools get the ``nvidia.com/mig.config`` label (a named mig-parted layout, or a layout
the portal writes into its mig-parted ConfigMap). Every object carries the portal's
managed-by label; team objects also the team label and the reservations annotation.
"""
from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Iterable

import yaml

from allocations.apply.desired import (
    MANAGED_BY_LABEL,
    MANAGED_BY_VALUE,
    RESERVATIONS_ANNOTATION,
    TEAM_LABEL,
    Grant,
    PoolDesired,
    TeamDesired,
)

QUOTA_NAME = "gpupool"
SYSTEM_NAMESPACE = "gpupool-system"
DEVICE_PLUGIN_CONFIGMAP = "gpupool-device-plugin-config"
MIG_PARTED_CONFIGMAP = "gpupool-mig-parted-config"
DEVICE_PLUGIN_CONFIG_LABEL = "nvidia.com/device-plugin.config"
MIG_CONFIG_LABEL = "nvidia.com/mig.config"
POOL_LABEL = "gpupool.io/pool"
# Node labels the portal sets (and removes again, through server-side apply ownership).
NODE_LABELS = (POOL_LABEL, DEVICE_PLUGIN_CONFIG_LABEL, MIG_CONFIG_LABEL)

GPU = "nvidia.com/gpu"
SHARED = "nvidia.com/gpu.shared"
HAMI_MEMORY = "nvidia.com/gpumem"
HAMI_CORES = "nvidia.com/gpucores"
QUOTA_PREFIX = "requests."
MANAGED_QUOTA_PREFIX = "requests.nvidia.com/"


def label_value(text: str) -> str:
    """A valid label value: at most 63 of [A-Za-z0-9-_.], starting and ending alphanumeric."""
    value = re.sub(r"[^A-Za-z0-9_.-]+", "-", text)[:63]
    return re.sub(r"^[^A-Za-z0-9]+|[^A-Za-z0-9]+$", "", value)


def _managed_labels(**extra: str) -> dict[str, str]:
    return {MANAGED_BY_LABEL: MANAGED_BY_VALUE, **extra}


def mig_resource(profile: str) -> str:
    return f"nvidia.com/mig-{profile}"


def grant_resources(grant: Grant) -> dict[str, int]:
    """What one grant counts as, per resource name of its sharing mode."""
    mode = grant.sharing_mode
    if mode in ("time_slicing", "mps"):
        return {SHARED: grant.units}
    if mode == "mig":
        return {mig_resource(grant.mig_profile): grant.units} if grant.mig_profile else {}
    if mode == "vgpu":
        return {GPU: grant.units, HAMI_MEMORY: grant.memory_mib, HAMI_CORES: grant.cores_pct}
    return {GPU: grant.units}


def pool_resource_names(pool: PoolDesired) -> set[str]:
    """The resource names a pool's GPUs are offered under on Kubernetes."""
    mode = pool.sharing_mode
    if mode in ("time_slicing", "mps"):
        return {SHARED}
    if mode == "mig":
        return {mig_resource(p) for p in (pool.sharing_config.get("profiles") or {})}
    if mode == "vgpu":
        return {GPU, HAMI_MEMORY, HAMI_CORES}
    return {GPU}


def team_totals(grants: Iterable[Grant]) -> dict[str, int]:
    """What a team holds, summed per resource name."""
    totals: dict[str, int] = defaultdict(int)
    for grant in grants:
        for name, amount in grant_resources(grant).items():
            totals[name] += amount
    return dict(totals)


def _reservations(team: TeamDesired) -> str:
    return ",".join(str(r) for r in team.reservation_ids)


def namespace_manifest(team: TeamDesired) -> dict:
    return {
        "apiVersion": "v1",
        "kind": "Namespace",
        "metadata": {
            "name": team.namespace,
            "labels": _managed_labels(**{TEAM_LABEL: label_value(team.team_slug)}),
            "annotations": {RESERVATIONS_ANNOTATION: _reservations(team)},
        },
    }


def quota_hard(team: TeamDesired, pools: Iterable[PoolDesired]) -> dict[str, str]:
    """spec.hard: the team's holdings for every GPU resource name on the cluster (0 where it holds none)."""
    totals = team_totals(team.grants)
    names = {GPU} | set(totals)
    for pool in pools:
        names |= pool_resource_names(pool)
    return {QUOTA_PREFIX + name: str(totals.get(name, 0)) for name in sorted(names)}


def quota_manifest(team: TeamDesired, pools: Iterable[PoolDesired]) -> dict:
    return {
        "apiVersion": "v1",
        "kind": "ResourceQuota",
        "metadata": {
            "name": QUOTA_NAME,
            "namespace": team.namespace,
            "labels": _managed_labels(**{TEAM_LABEL: label_value(team.team_slug)}),
            "annotations": {RESERVATIONS_ANNOTATION: _reservations(team)},
        },
        "spec": {"hard": quota_hard(team, pools)},
    }


def system_namespace_manifest(namespace: str = SYSTEM_NAMESPACE) -> dict:
    return {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace, "labels": _managed_labels()}}


def device_plugin_config_name(pool: PoolDesired) -> str:
    return label_value(f"gpupool-{pool.pool_slug}")


def device_plugin_config(pool: PoolDesired) -> str:
    """The NVIDIA device plugin's config file (v1) for a time_slicing or mps pool."""
    sharing = "mps" if pool.sharing_mode == "mps" else "timeSlicing"
    replicas = int(pool.sharing_config.get("replicas") or 2)
    config = {"version": "v1", "sharing": {sharing: {"renameByDefault": True,
                                                    "resources": [{"name": GPU, "replicas": replicas}]}}}
    return yaml.safe_dump(config, sort_keys=True)


def device_plugin_configmap_manifest(pools: Iterable[PoolDesired], namespace: str = SYSTEM_NAMESPACE) -> dict:
    """One ConfigMap, one key per shared pool (the device plugin's multi-config: a node label picks the key)."""
    data = {"default": yaml.safe_dump({"version": "v1"}, sort_keys=True)}
    for pool in pools:
        if pool.sharing_mode in ("time_slicing", "mps"):
            data[device_plugin_config_name(pool)] = device_plugin_config(pool)
    return {"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": DEVICE_PLUGIN_CONFIGMAP, "namespace": namespace, "labels": _managed_labels()},
            "data": data}


def mig_config_name(pool: PoolDesired) -> str:
    """The mig-parted layout a mig pool's nodes get: the named one, all-<profile>, or the portal's own."""
    layout = pool.sharing_config.get("mig_layout")
    if layout:
        return label_value(str(layout))
    profiles = pool.sharing_config.get("profiles") or {}
    if len(profiles) == 1:
        return label_value(f"all-{next(iter(profiles))}")
    return label_value(f"gpupool-{pool.pool_slug}")


def mig_parted_configmap_manifest(pools: Iterable[PoolDesired], namespace: str = SYSTEM_NAMESPACE, *,
                                  empty: bool = False) -> dict | None:
    """mig-parted layouts for mig pools that list several profiles (None when no pool needs one,
    unless `empty`: then a ConfigMap with no layouts, to clear one the portal wrote before)."""
    configs = {}
    for pool in pools:
        profiles = pool.sharing_config.get("profiles") or {}
        if pool.sharing_mode == "mig" and not pool.sharing_config.get("mig_layout") and len(profiles) > 1:
            configs[mig_config_name(pool)] = [{"devices": "all", "mig-enabled": True,
                                               "mig-devices": {k: int(v) for k, v in sorted(profiles.items())}}]
    if not configs and not empty:
        return None
    document = yaml.safe_dump({"version": "v1", "mig-configs": configs}, sort_keys=True)
    return {"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": MIG_PARTED_CONFIGMAP, "namespace": namespace, "labels": _managed_labels()},
            "data": {"config.yaml": document}}


def node_labels(pools: Iterable[PoolDesired]) -> dict[str, dict[str, str]]:
    """node name -> the labels the portal wants on it (only pools whose mode configures nodes).

    A node listed by two such pools keeps the first (by pool slug); mixing two node-level
    sharing modes on one node cannot work, and the inventory should not allow it.
    """
    wanted: dict[str, dict[str, str]] = {}
    for pool in sorted(pools, key=lambda p: p.pool_slug):
        if pool.sharing_mode in ("time_slicing", "mps"):
            labels = {POOL_LABEL: label_value(pool.pool_slug), DEVICE_PLUGIN_CONFIG_LABEL: device_plugin_config_name(pool)}
        elif pool.sharing_mode == "mig":
            labels = {POOL_LABEL: label_value(pool.pool_slug), MIG_CONFIG_LABEL: mig_config_name(pool)}
        else:
            continue
        for node in pool.node_names:
            wanted.setdefault(node, labels)
    return wanted


def node_manifest(name: str, labels: dict[str, str]) -> dict:
    """A partial Node for server-side apply: only the labels the portal owns (none = remove them)."""
    return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": dict(labels)}}
