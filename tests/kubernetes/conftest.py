"""A real Kubernetes control plane (etcd + kube-apiserver/-controller-manager/-scheduler v1.20.2) for these tests.

Started once per session on loopback by ``scripts/kube-control-plane start`` in a temporary
directory and stopped at the end. If it cannot start, the tests FAIL (they do not skip):
CI must exercise the real API server. There is no kubelet, so tests create GPU nodes
through the API themselves (:func:`make_gpu_node`).
"""
from __future__ import annotations

import subprocess
import time
import uuid
import warnings
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml
from kubernetes import client as k8s
from kubernetes.config.kube_config import new_client_from_config_dict

from inventory.models import Cluster
from tests.factories import ClusterFactory

BASE_DIR = Path(__file__).resolve().parents[2]
SCRIPT = BASE_DIR / "scripts" / "kube-control-plane"
# kubernetes-validate bundles schemas from 1.20.0 on (1.28.3, pinned); the control plane is 1.20.2.
SCHEMA_VERSION = "1.20.0"


@pytest.fixture(autouse=True)
def patient_quota_wait(monkeypatch):
    """A test's one sync waits up to 30 s for the control plane's quota controller to count a quota, not the 5 s of
    production, where the lifecycle retries a BackendPending: on a loaded CI machine (an image build and the browser
    tests beside it) the controller once took over 5 s and a MIG quota test failed with nothing wrong."""
    from allocations.apply.backends.kubernetes import KubernetesBackend

    monkeypatch.setattr(KubernetesBackend, "QUOTA_WAIT_SECONDS", 30.0)


@dataclass
class ControlPlane:
    dir: Path
    kubeconfig: str  # self-contained YAML (CA embedded, token user)
    server: str
    token: str

    def client(self) -> k8s.ApiClient:
        return new_client_from_config_dict(yaml.safe_load(self.kubeconfig), persist_config=False)

    def kubeconfig_with(self, *, server: str | None = None, token: str | None = None) -> str:
        config = yaml.safe_load(self.kubeconfig)
        if server:
            config["clusters"][0]["cluster"]["server"] = server
        if token:
            config["users"][0]["user"]["token"] = token
        return yaml.safe_dump(config)


@pytest.fixture(scope="session")
def control_plane(tmp_path_factory) -> ControlPlane:
    directory = tmp_path_factory.mktemp("kube")
    try:
        started = subprocess.run([str(SCRIPT), "start", str(directory)], capture_output=True, text=True,
                                 timeout=900)
    except subprocess.TimeoutExpired as exc:
        subprocess.run([str(SCRIPT), "stop", str(directory)], capture_output=True, timeout=60)
        pytest.fail(f"the Kubernetes control plane did not start within 900 s: {exc}")
    if started.returncode != 0:
        pytest.fail("the Kubernetes control plane did not start (scripts/kube-control-plane start):\n"
                    + started.stdout[-2000:] + started.stderr[-4000:])
    env = dict(line.split("=", 1) for line in started.stdout.splitlines() if "=" in line)
    kubeconfig = (directory / "kubeconfig").read_text()
    token = yaml.safe_load(kubeconfig)["users"][0]["user"]["token"]
    plane = ControlPlane(dir=directory, kubeconfig=kubeconfig, server=env["KUBE_SERVER"], token=token)
    yield plane
    subprocess.run([str(SCRIPT), "stop", str(directory)], capture_output=True, timeout=60)


@pytest.fixture(scope="session")
def kube_api(control_plane) -> k8s.ApiClient:
    api = control_plane.client()
    yield api
    api.close()


@pytest.fixture(scope="session")
def core(kube_api) -> k8s.CoreV1Api:
    return k8s.CoreV1Api(kube_api)


@pytest.fixture
def kube_cluster(db, control_plane, core) -> Cluster:
    """A registered Kubernetes cluster row holding the control plane's kubeconfig (encrypted).

    The control plane is shared by the session, so every test that takes this fixture starts
    with no Nodes: discovery then sees only the nodes the test makes. (Namespaces stay; tests
    use unique team names.)
    """
    from common import crypto

    core.delete_collection_node()
    deadline = time.monotonic() + 10
    while core.list_node().items:
        if time.monotonic() > deadline:
            pytest.fail("the control plane's nodes were not deleted within 10 s")
        time.sleep(0.05)
    return ClusterFactory(slug=f"k8s-{uuid.uuid4().hex[:6]}", kind=Cluster.Kind.KUBERNETES,
                          kubeconfig_encrypted=crypto.encrypt(control_plane.kubeconfig))


def unique(prefix: str) -> str:
    """A name no other test in this session uses (the control plane is shared)."""
    return f"{prefix}-{uuid.uuid4().hex[:6]}"


GFD_H100 = {
    "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3",
    "nvidia.com/gpu.memory": "81559",
    "nvidia.com/gpu.count": "4",
    "nvidia.com/mig.capable": "true",
    "nvidia.com/cuda.driver.major": "535",
    "nvidia.com/cuda.driver.minor": "104",
    "nvidia.com/cuda.driver.rev": "05",
    "nvidia.com/cuda.runtime.major": "12",
    "nvidia.com/cuda.runtime.minor": "2",
}


def make_gpu_node(core: k8s.CoreV1Api, name: str, *, gpus: int = 4, labels: dict | None = None,
                  annotations: dict | None = None, ready: bool = True, extra: dict | None = None) -> None:
    """A Node as a kubelet plus the NVIDIA device plugin and GFD would report it (status via the subresource)."""
    node_labels = {"kubernetes.io/hostname": name, "kubernetes.io/os": "linux", **GFD_H100,
                   "nvidia.com/gpu.count": str(gpus), **(labels or {})}
    core.create_node({"apiVersion": "v1", "kind": "Node",
                      "metadata": {"name": name, "labels": node_labels, "annotations": annotations or {}}})
    resources = {"cpu": "64", "memory": "512Gi", "pods": "110", "nvidia.com/gpu": str(gpus), **(extra or {})}
    set_ready(core, name, ready, resources=resources)


def set_ready(core: k8s.CoreV1Api, name: str, ready: bool, *, resources: dict | None = None,
              reason: str | None = None) -> None:
    condition = {"type": "Ready", "status": "True" if ready else "False",
                 "reason": reason or ("KubeletReady" if ready else "KubeletNotReady"),
                 "message": "kubelet is posting ready status" if ready else "container runtime is down"}
    status: dict = {"conditions": [condition]}
    if resources is not None:
        status["capacity"] = resources
        status["allocatable"] = resources
    core.patch_node_status(name, {"status": status})


def validate_manifest(manifest: dict) -> None:
    """Check one manifest against the Kubernetes OpenAPI schema (strict: no unknown fields)."""
    import kubernetes_validate

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # kubernetes-validate 1.28 uses jsonschema.RefResolver
        kubernetes_validate.validate(manifest, SCHEMA_VERSION, strict=True)


def active_reservation(cluster: Cluster, prefix: str, *, node_gpus: int = 4, gpus: int = 2):
    """A team holding `gpus` GPUs now (an active reservation) on a new node of a new pool of `cluster`.

    Returns (team, reservation, namespace). The node is only a database row: tests that need it
    in the API server create it there themselves.
    """
    from datetime import timedelta

    from django.utils import timezone

    from allocations.apply.desired import team_namespace
    from allocations.models import Allocation, Reservation
    from tests.factories import PoolFactory, QuotaFactory, TeamFactory, add_node

    team = TeamFactory(slug=unique(prefix))
    pool = PoolFactory(slug=unique(f"{prefix}-pool"))
    node = add_node(pool, unique(f"node-{prefix}"), node_gpus, cluster=cluster)
    QuotaFactory(team=team, pool=pool, max_ge=node_gpus)
    now = timezone.now()
    reservation = Reservation.objects.create(team=team, pool=pool, gpus=gpus, starts_at=now - timedelta(minutes=1),
                                             ends_at=now + timedelta(hours=1), state=Reservation.State.ACTIVE)
    for gpu in node.gpus.order_by("index")[:gpus]:
        Allocation.objects.create(reservation=reservation, gpu=gpu, starts_at=reservation.starts_at,
                                  ends_at=reservation.ends_at)
    return team, reservation, team_namespace(team.slug)
