"""The Kubernetes objects the portal manages, as plain dicts built from the desired state. Pure functions.

Per team: a Namespace (``team_namespace(slug)``) and a ResourceQuota ``gpupool`` in it whose
``spec.hard`` caps the team's GPU requests at what it holds right now, for every GPU
resource name used on the cluster (0 for what it does not hold, so an unreserved pool is
closed to it). What each sharing mode counts, per resource name (``requests.<name>`` unless said):

=============  ====================================================================================
exclusive      ``nvidia.com/gpu``: whole GPUs held
time_slicing   ``nvidia.com/gpu.shared``: shares held, one per share slot (the device plugin runs
               with ``renameByDefault``, so a GPU of N replicas is offered as N of this name)
mps            ``nvidia.com/gpu.shared``: idem (MPS sharing of the device plugin)
mig            ``nvidia.com/mig-<profile>``: instances of that profile held (mixed strategy); every
               profile of every mig pool's layout is listed, 0 where the team holds none
vgpu (HAMi)    ``nvidia.com/gpu``: vGPU devices held (one per GPU granted); ``nvidia.com/gpumem``:
               MiB, ``nvidia.com/gpucores``: percent, each summed over the devices held. Written
               twice: ``limits.nvidia.com/{gpu,gpumem,gpucores}`` is HAMi's extended quota, which
               its scheduler enforces counting a pod's memory and cores once per device it gets
               (``gpu: 2, gpumem: 2000`` is 4000); ``requests.`` is what the API server itself
               counts, a pod's amounts as written (2000 there), a looser cap that holds without HAMi
=============  ====================================================================================

Per pool that needs node configuration: time_slicing and mps pools get an entry in the
device-plugin ConfigMap (``sharing.timeSlicing`` / ``sharing.mps`` with the pool's
``replicas``) and the ``nvidia.com/device-plugin.config`` label on their nodes; mig pools get
an entry with ``flags.migStrategy: mixed`` and the ``nvidia.com/mig.config`` label: a named
layout (``all-1g.10gb``, ``all-balanced``) as it is, a profile list equal to a named
``all-<profile>`` layout by that name, any other list as ``gpupool-<pool>``, a layout the
portal writes into its mig-parted ConfigMap. A dynamic mig pool's nodes each get a config of
their own in that ConfigMap (per GPU, the instances its grants hold now) and a label naming
it, which changes with the layout (dynamic_node_configs). Every object carries the portal's managed-by
label; team objects also the team label and the reservations annotation.
"""
from __future__ import annotations

import hashlib
import re
from collections import Counter, defaultdict
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
from allocations.placement.mig import LayoutError, named_layout, profiles_for
from inventory.sharing import REPLICA_MODES, mig_dynamic, mig_layout_names

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
# HAMi's extended ResourceQuota: its scheduler reads these names and counts memory and cores per device.
HAMI_QUOTA_PREFIX = "limits."
HAMI_RESOURCES = (GPU, HAMI_MEMORY, HAMI_CORES)
MANAGED_QUOTA_PREFIX = "requests.nvidia.com/"
MIG_STRATEGY = "mixed"


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
    if mode in REPLICA_MODES:
        return {SHARED: grant.units}
    if mode == "mig":
        return {mig_resource(grant.mig_profile): grant.units} if grant.mig_profile else {}
    if mode == "vgpu":
        return {GPU: grant.units, HAMI_MEMORY: grant.memory_mib, HAMI_CORES: grant.cores_pct}
    return {GPU: grant.units}


def mig_layout_profiles(pool: PoolDesired) -> list[str]:
    """The profiles of one GPU's layout in a mig pool, in the pool's layout order.

    A named layout is expanded for each GPU model of the pool (the union, when models differ);
    a model the layout does not fit adds nothing, and an ``all-<profile>`` name on a pool whose
    models are unknown still names its profile, so the quota lists it."""
    if mig_dynamic(pool.sharing_config):  # carved on demand: any profile of its models (no +me ones)
        offered = {p.name: p for model in pool.gpu_models for p in profiles_for(model).values()
                   if not p.single_per_gpu}
        return [p.name for p in sorted(offered.values(), key=lambda p: (p.size, p.memory_mib, p.name))]
    layout = mig_layout_names(pool.sharing_config)
    if not isinstance(layout, str):
        return list(layout)
    profiles: list[str] = []
    for model in pool.gpu_models:
        try:
            named = named_layout(model, layout)
        except LayoutError:
            continue
        profiles += [p for p in named if p not in profiles]
    if not profiles and layout.startswith("all-") and layout != "all-balanced":
        profiles = [layout[len("all-"):]]
    return profiles


def pool_resource_names(pool: PoolDesired) -> set[str]:
    """The resource names a pool's GPUs are offered under on Kubernetes."""
    mode = pool.sharing_mode
    if mode in REPLICA_MODES:
        return {SHARED}
    if mode == "mig":
        return {mig_resource(p) for p in mig_layout_profiles(pool)}
    if mode == "vgpu":
        return set(HAMI_RESOURCES)
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
    hard = {QUOTA_PREFIX + name: str(totals.get(name, 0)) for name in names}
    if HAMI_MEMORY in names or HAMI_CORES in names:
        # HAMi's scheduler enforces these, counting a pod's memory and cores once per device.
        hard.update({HAMI_QUOTA_PREFIX + name: str(totals.get(name, 0)) for name in HAMI_RESOURCES})
    return dict(sorted(hard.items()))


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
    """The NVIDIA device plugin's config file (v1) for a time_slicing, mps or mig pool."""
    if pool.sharing_mode == "mig":
        # Mixed: each profile is its own resource, nvidia.com/mig-<profile>, which the quota counts.
        config: dict = {"version": "v1", "flags": {"migStrategy": MIG_STRATEGY}}
    else:
        sharing = "mps" if pool.sharing_mode == "mps" else "timeSlicing"
        replicas = int(pool.sharing_config.get("replicas") or 2)
        config = {"version": "v1", "sharing": {sharing: {"renameByDefault": True,
                                                        "resources": [{"name": GPU, "replicas": replicas}]}}}
    return yaml.safe_dump(config, sort_keys=True)


def configures_device_plugin(pool: PoolDesired) -> bool:
    return pool.sharing_mode in ("time_slicing", "mps", "mig")


def device_plugin_configmap_manifest(pools: Iterable[PoolDesired], namespace: str = SYSTEM_NAMESPACE) -> dict:
    """One ConfigMap, one key per shared or MIG pool (the device plugin's multi-config: a node label picks the key)."""
    data = {"default": yaml.safe_dump({"version": "v1"}, sort_keys=True)}
    for pool in pools:
        if configures_device_plugin(pool):
            data[device_plugin_config_name(pool)] = device_plugin_config(pool)
    return {"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": DEVICE_PLUGIN_CONFIGMAP, "namespace": namespace, "labels": _managed_labels()},
            "data": data}


def _named_equivalent(pool: PoolDesired, profiles: list[str]) -> str | None:
    """The ``all-<profile>`` name of a profile list, when it is exactly that layout on every model of the pool."""
    if not profiles or len(set(profiles)) != 1 or not pool.gpu_models:
        return None
    name = f"all-{profiles[0]}"
    for model in pool.gpu_models:
        try:
            if sorted(named_layout(model, name)) != sorted(profiles):
                return None
        except LayoutError:
            return None
    return name


def mig_config_name(pool: PoolDesired) -> str:
    """The mig-parted layout a mig pool's nodes get (``nvidia.com/mig.config``): the named one as it is,
    the ``all-<profile>`` name of a list that is exactly that, else the portal's own ``gpupool-<pool>``."""
    layout = mig_layout_names(pool.sharing_config)
    if isinstance(layout, str):
        return label_value(layout)
    return label_value(_named_equivalent(pool, layout) or f"gpupool-{pool.pool_slug}")


def custom_mig_layout(pool: PoolDesired) -> dict[str, int] | None:
    """{profile: count} of a mig pool whose layout the portal must write for mig-parted (None otherwise)."""
    if pool.sharing_mode != "mig":
        return None
    layout = mig_layout_names(pool.sharing_config)
    if mig_dynamic(pool.sharing_config) or isinstance(layout, str) or not layout or _named_equivalent(pool, layout):
        return None
    return dict(sorted(Counter(layout).items()))


def _idle_devices(pool: PoolDesired, model: str) -> dict[str, int]:
    """What an idle GPU of a dynamic MIG pool is set to: the pool's layout, when it names one that fits
    the model, else MIG mode with no instances (mig-parted's all-enabled)."""
    layout = mig_layout_names(pool.sharing_config)
    try:
        names = named_layout(model, layout) if isinstance(layout, str) else list(layout)
    except LayoutError:
        return {}
    return dict(sorted(Counter(names).items())) if all(n in profiles_for(model) for n in names) else {}


def dynamic_node_configs(pool: PoolDesired) -> dict[str, tuple[str, list[dict]]]:
    """node -> (its mig-parted config name, the config) for a dynamic MIG pool: one entry per GPU, with the
    instances its grants hold now (an idle GPU: _idle_devices). The name is the pool's and a digest of
    the layout, so the node's ``nvidia.com/mig.config`` label changes exactly when its layout does, which
    is what NVIDIA's MIG manager watches to apply it; nodes with the same layout share one config.

    mig-parted takes counts per GPU, not start slices: it places the instances itself."""
    per_node: dict[str, list[dict]] = defaultdict(list)
    for node, index, model, held in pool.mig_gpus:
        devices = dict(sorted(Counter(held).items())) if held else _idle_devices(pool, model)
        per_node[node].append({"devices": [index], "mig-enabled": True, "mig-devices": devices})
    configs = {}
    for node, entries in per_node.items():
        digest = hashlib.sha256(yaml.safe_dump(entries, sort_keys=True).encode()).hexdigest()[:10]
        configs[node] = (label_value(f"gpupool-{pool.pool_slug}"[:50] + f"-{digest}"), entries)
    return configs


def mig_parted_configmap_manifest(pools: Iterable[PoolDesired], namespace: str = SYSTEM_NAMESPACE, *,
                                  empty: bool = False) -> dict | None:
    """mig-parted layouts for mig pools with a layout of their own, and one per node layout of the dynamic
    ones (None when no pool needs one, unless `empty`: then a ConfigMap with no layouts, to clear one the
    portal wrote before)."""
    configs = {}
    for pool in pools:
        if pool.sharing_mode == "mig" and mig_dynamic(pool.sharing_config):
            configs.update(dynamic_node_configs(pool).values())
            continue
        devices = custom_mig_layout(pool)
        if devices:
            configs[mig_config_name(pool)] = [{"devices": "all", "mig-enabled": True, "mig-devices": devices}]
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
        if not configures_device_plugin(pool):
            continue
        labels = {POOL_LABEL: label_value(pool.pool_slug), DEVICE_PLUGIN_CONFIG_LABEL: device_plugin_config_name(pool)}
        dynamic = dynamic_node_configs(pool) if pool.sharing_mode == "mig" and mig_dynamic(pool.sharing_config) else {}
        if pool.sharing_mode == "mig" and not dynamic:
            labels[MIG_CONFIG_LABEL] = mig_config_name(pool)
        for node in pool.node_names:
            if node in dynamic:
                wanted.setdefault(node, {**labels, MIG_CONFIG_LABEL: dynamic[node][0]})
            else:
                wanted.setdefault(node, labels)
    return wanted


def node_manifest(name: str, labels: dict[str, str]) -> dict:
    """A partial Node for server-side apply: only the labels the portal owns (none = remove them)."""
    return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": dict(labels)}}
