"""Turn a Kubernetes Node object (as the API's JSON) into what the inventory stores. Pure functions.

What a node says about its GPUs:

- resources in status.capacity / status.allocatable: ``nvidia.com/gpu`` (whole GPUs, or
  replicas under time-slicing/MPS without renaming, or HAMi's vGPU slots),
  ``nvidia.com/gpu.shared`` (time-slicing/MPS with ``renameByDefault``),
  ``nvidia.com/mig-<profile>`` (MIG, mixed strategy), HAMi's ``nvidia.com/gpumem`` and
  ``nvidia.com/gpucores``;
- GPU Feature Discovery labels: ``nvidia.com/gpu.product``, ``nvidia.com/gpu.memory`` (MiB),
  ``nvidia.com/gpu.count`` (physical cards), ``nvidia.com/gpu.replicas`` and
  ``nvidia.com/gpu.sharing-strategy`` (time-slicing/MPS), ``nvidia.com/mig.capable``,
  ``nvidia.com/mig.strategy`` (single/mixed), per MIG profile under the mixed strategy
  ``nvidia.com/mig-<profile>.count``, ``.memory`` (MiB), ``.multiprocessors``, ``.slices.gi``,
  ``.slices.ci``, ``.engines.*``, ``.replicas``; the MIG manager's ``nvidia.com/mig.config``
  (the layout asked for) and ``nvidia.com/mig.config.state`` (pending, rebooting, success,
  failed); ``nvidia.com/cuda.driver.major/minor/rev``, ``nvidia.com/cuda.runtime.major/minor``;
- the Ready condition: the node's health.

Node.labels keeps every label; Node.gpu_resources keeps the ``nvidia.com/`` capacity and
allocatable and, read from both, ``sharing`` (replicas and strategy of time-slicing/MPS, the
shared resource's capacity), ``mig`` (strategy, layout and its state, and per profile the
instances offered and GFD's figures) and ``hami`` (vGPU slots, memory, cores), each only when
the node has it.

GPU identity: a Node object does not list GPU UUIDs. When the node carries them — our own
annotation ``gpupool.io/gpu-uuids`` ("GPU-…,GPU-…" in index order) or HAMi's
``hami.io/node-nvidia-register`` — those are used. Otherwise each card gets a stable
made-up id, ``k8s-<uuid5(cluster, node, index)>``: the same on every discovery, so
allocations keep pointing at the same rows, and recognisably not an NVIDIA UUID (the
``GPU-`` prefix is NVML's), so nothing hands it to a device plugin as if it were one.
"""
from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass, field
from decimal import Decimal, InvalidOperation
from typing import Any

from kubernetes.utils import parse_quantity as _parse_quantity

GPU_RESOURCE = "nvidia.com/gpu"
SHARED_RESOURCE = "nvidia.com/gpu.shared"
MIG_RESOURCE_PREFIX = "nvidia.com/mig-"
HAMI_MEMORY_RESOURCE = "nvidia.com/gpumem"
HAMI_CORES_RESOURCE = "nvidia.com/gpucores"
UUIDS_ANNOTATION = "gpupool.io/gpu-uuids"
HAMI_REGISTER_ANNOTATION = "hami.io/node-nvidia-register"
SYNTHETIC_PREFIX = "k8s-"
# A fixed namespace for uuid5, so made-up GPU ids are the same on every portal install.
_GPU_ID_NAMESPACE = uuid.UUID("6f1c1a52-5d0e-4c53-9a53-2f0f6c2b7a11")


@dataclass(frozen=True)
class DiscoveredGpu:
    index: int
    uuid: str
    model_name: str
    memory_mib: int
    mig_capable: bool
    driver_version: str
    cuda_version: str


@dataclass(frozen=True)
class DiscoveredNode:
    name: str
    ready: bool
    health_reason: str
    schedulable: bool
    labels: dict[str, str]
    cpu_milli: int
    memory_mib: int
    gpu_resources: dict[str, Any]
    gpus: tuple[DiscoveredGpu, ...] = field(default_factory=tuple)


def parse_quantity(value: Any) -> Decimal:
    """A Kubernetes quantity ("2", "500m", "16Gi") as a Decimal; 0 when missing or unreadable."""
    if value is None:
        return Decimal(0)
    try:
        return _parse_quantity(value)
    except (ValueError, TypeError, InvalidOperation):
        return Decimal(0)


def _int_label(labels: dict[str, str], key: str) -> int | None:
    try:
        return int(labels[key])
    except (KeyError, TypeError, ValueError):
        return None


def synthetic_gpu_id(cluster_key: str, node_name: str, index: int) -> str:
    return SYNTHETIC_PREFIX + str(uuid.uuid5(_GPU_ID_NAMESPACE, f"{cluster_key}/{node_name}/{index}"))


def is_real_gpu_uuid(value: str) -> bool:
    return value.startswith(("GPU-", "MIG-"))


def _hami_devices(annotation: str | None) -> list[dict[str, Any]]:
    """HAMi's device register annotation: JSON (newer) or "uuid,count,mem,cores,type,numa,health:" (older)."""
    if not annotation:
        return []
    try:
        data = json.loads(annotation)
        if isinstance(data, list):
            return [{"id": d.get("id", ""), "devmem": d.get("devmem", 0), "type": d.get("type", "")}
                    for d in data if isinstance(d, dict)]
    except ValueError:
        pass
    devices = []
    for entry in annotation.split(":"):
        parts = entry.split(",")
        if len(parts) >= 5 and parts[0]:
            try:
                devices.append({"id": parts[0], "devmem": int(parts[2]), "type": parts[4]})
            except ValueError:
                continue
    return devices


def _model_name(product: str | None) -> str:
    if not product:
        return ""
    # GFD marks shared and single-strategy MIG products: "…-SHARED", "…-MIG-1g.10gb".
    product = re.sub(r"-SHARED$", "", product)
    product = re.sub(r"-MIG-\d+g\.\d+gb.*$", "", product)
    return product


MIG_LABEL_PREFIX = "nvidia.com/mig-"
# GFD's per-profile MIG labels (mixed strategy) that are numbers, and the key each gets here.
_MIG_FIGURES = {"count": "count", "memory": "memory_mib", "multiprocessors": "multiprocessors",
                "slices.gi": "slices_gi", "slices.ci": "slices_ci", "replicas": "replicas",
                "engines.copy": "engines_copy", "engines.decoder": "engines_decoder",
                "engines.encoder": "engines_encoder", "engines.jpeg": "engines_jpeg", "engines.ofa": "engines_ofa"}


def _mig(labels: dict[str, str], capacity: dict[str, Any], allocatable: dict[str, Any]) -> dict[str, Any]:
    """The node's MIG setup from GFD's and the MIG manager's labels and the mig-<profile> resources."""
    profiles: dict[str, dict[str, int]] = {}
    for key, value in labels.items():
        if not key.startswith(MIG_LABEL_PREFIX):
            continue
        profile, _, figure = key[len(MIG_LABEL_PREFIX):].partition(".")
        # "1g.10gb.count": the profile name has a dot of its own.
        head, _, rest = figure.partition(".")
        profile, figure = f"{profile}.{head}", rest
        if figure in _MIG_FIGURES:
            try:
                profiles.setdefault(profile, {})[_MIG_FIGURES[figure]] = int(value)
            except ValueError:
                continue
    for part, values in (("capacity", capacity), ("allocatable", allocatable)):
        for name, amount in values.items():
            if name.startswith(MIG_RESOURCE_PREFIX):
                profiles.setdefault(name[len(MIG_RESOURCE_PREFIX):], {})[part] = int(parse_quantity(amount))
    out: dict[str, Any] = {key: labels[label] for key, label in (
        ("strategy", "nvidia.com/mig.strategy"), ("config", "nvidia.com/mig.config"),
        ("config_state", "nvidia.com/mig.config.state")) if labels.get(label)}
    if profiles:
        out["profiles"] = dict(sorted(profiles.items()))
    return out


def _gpu_resources(status: dict[str, Any], labels: dict[str, str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for part in ("capacity", "allocatable"):
        values = {k: str(v) for k, v in (status.get(part) or {}).items() if k.startswith("nvidia.com/")}
        if values:
            out[part] = dict(sorted(values.items()))
    capacity, allocatable = out.get("capacity", {}), out.get("allocatable", {})
    sharing = {}
    replicas = _int_label(labels, "nvidia.com/gpu.replicas")
    if replicas is not None and replicas > 1:
        sharing["replicas"] = replicas
    if labels.get("nvidia.com/gpu.sharing-strategy") not in (None, "", "none"):
        sharing["strategy"] = labels["nvidia.com/gpu.sharing-strategy"]
    if SHARED_RESOURCE in capacity:
        sharing["shared_capacity"] = int(parse_quantity(capacity[SHARED_RESOURCE]))
        sharing["shared_allocatable"] = int(parse_quantity(allocatable.get(SHARED_RESOURCE)))
    if sharing:
        out["sharing"] = sharing
    mig = _mig(labels, capacity, allocatable)
    if mig:
        out["mig"] = mig
    if HAMI_MEMORY_RESOURCE in capacity or HAMI_CORES_RESOURCE in capacity:
        out["hami"] = {"vgpus": int(parse_quantity(capacity.get(GPU_RESOURCE))),
                       "memory_mib": int(parse_quantity(capacity.get(HAMI_MEMORY_RESOURCE))),
                       "cores_pct": int(parse_quantity(capacity.get(HAMI_CORES_RESOURCE)))}
    return out


def _gpu_count(labels: dict[str, str], capacity: dict[str, Any], hami: list[dict[str, Any]]) -> int:
    """Physical cards: GFD's count, else HAMi's register, else the resources divided by the sharing factor."""
    count = _int_label(labels, "nvidia.com/gpu.count")
    if count is not None:
        return max(count, 0)
    if hami:
        return len(hami)
    cores = parse_quantity(capacity.get(HAMI_CORES_RESOURCE))
    if cores > 0:
        return int(cores // 100)
    replicas = max(_int_label(labels, "nvidia.com/gpu.replicas") or 1, 1)
    for resource in (GPU_RESOURCE, SHARED_RESOURCE):
        amount = parse_quantity(capacity.get(resource))
        if amount > 0:
            return int(amount // replicas)
    return 0


def parse_node(node: dict[str, Any], *, cluster_key: str) -> DiscoveredNode:
    """One Node (the API's JSON) as a DiscoveredNode. `cluster_key` seeds the made-up GPU ids."""
    metadata = node.get("metadata") or {}
    status = node.get("status") or {}
    spec = node.get("spec") or {}
    name = metadata["name"]
    labels = {str(k): str(v) for k, v in (metadata.get("labels") or {}).items()}
    annotations = metadata.get("annotations") or {}
    capacity = status.get("capacity") or {}

    ready = next((c for c in status.get("conditions") or [] if c.get("type") == "Ready"), None)
    if ready is None:
        healthy, reason = False, "Kubernetes node has no Ready condition"
    elif ready.get("status") == "True":
        healthy, reason = True, "Kubernetes node Ready"
    else:
        state = "NotReady" if ready.get("status") == "False" else f"Ready={ready.get('status')}"
        why = ready.get("reason") or ready.get("message") or "no reason given"
        healthy, reason = False, f"Kubernetes node {state}: {why}"

    hami = _hami_devices(annotations.get(HAMI_REGISTER_ANNOTATION))
    count = _gpu_count(labels, capacity, hami)
    given = [u.strip() for u in str(annotations.get(UUIDS_ANNOTATION, "")).split(",") if u.strip()]
    if len(given) != count or len(set(given)) != count:
        given = [str(d["id"]) for d in hami] if len(hami) == count else []
    if len(set(given)) != len(given) or not all(given):
        given = []  # a list that names a card twice identifies nothing: fall back to made-up ids
    memory = _int_label(labels, "nvidia.com/gpu.memory")
    if memory is None and hami:
        memory = int(hami[0].get("devmem") or 0)
    if memory is None and count:
        memory = int(parse_quantity(capacity.get(HAMI_MEMORY_RESOURCE)) // count)
    model = _model_name(labels.get("nvidia.com/gpu.product")) or (hami[0]["type"] if hami else "") or "NVIDIA GPU"
    driver = ".".join(labels[k] for k in ("nvidia.com/cuda.driver.major", "nvidia.com/cuda.driver.minor",
                                          "nvidia.com/cuda.driver.rev") if labels.get(k))
    cuda = ".".join(labels[k] for k in ("nvidia.com/cuda.runtime.major", "nvidia.com/cuda.runtime.minor")
                    if labels.get(k))
    mig_capable = labels.get("nvidia.com/mig.capable", "").lower() == "true"
    gpus = tuple(
        DiscoveredGpu(index=i, uuid=(given[i] if given else synthetic_gpu_id(cluster_key, name, i))[:64],
                      model_name=model[:128], memory_mib=max(int(memory or 0), 0), mig_capable=mig_capable,
                      driver_version=driver[:32], cuda_version=cuda[:16])
        for i in range(count)
    )
    cpu = parse_quantity(capacity.get("cpu"))
    mem = parse_quantity(capacity.get("memory"))
    return DiscoveredNode(
        name=name, ready=healthy, health_reason=reason[:255], schedulable=not spec.get("unschedulable", False),
        labels=labels, cpu_milli=min(int(cpu * 1000), 2**31 - 1), memory_mib=min(int(mem // 2**20), 2**31 - 1),
        gpu_resources=_gpu_resources(status, labels), gpus=gpus,
    )
