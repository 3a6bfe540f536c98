"""Discovery against the real API server: nodes → Node/Gpu/pool rows, health, the signal, the endpoint."""
from __future__ import annotations

import pytest

from inventory.kubernetes.client import ClusterError
from inventory.kubernetes.discovery import discover_cluster
from inventory.kubernetes.nodes import parse_node, synthetic_gpu_id
from inventory.models import Cluster, Gpu, Node
from inventory.signals import node_health_changed
from tests.factories import UserFactory
from tests.kubernetes.conftest import make_gpu_node, set_ready, unique


@pytest.fixture
def health_events():
    events = []

    def receiver(sender, **kwargs):
        events.append(kwargs)

    node_health_changed.connect(receiver)
    yield events
    node_health_changed.disconnect(receiver)


def test_discovery_creates_nodes_gpus_and_a_pool_per_model(kube_cluster, core):
    name = unique("gpu-h100")
    make_gpu_node(core, name, gpus=4)
    report = discover_cluster(kube_cluster)

    node = Node.objects.get(cluster=kube_cluster, name=name)
    assert node.healthy and node.schedulable
    assert (node.cpu_milli, node.memory_mib) == (64000, 512 * 1024)
    assert node.labels["nvidia.com/gpu.product"] == "NVIDIA-H100-80GB-HBM3"
    assert node.gpu_resources["capacity"] == {"nvidia.com/gpu": "4"}
    gpus = list(node.gpus.order_by("index"))
    assert [g.index for g in gpus] == [0, 1, 2, 3]
    gpu = gpus[0]
    assert (gpu.model_name, gpu.memory_mib, gpu.mig_capable) == ("NVIDIA-H100-80GB-HBM3", 81559, True)
    assert (gpu.driver_version, gpu.cuda_version) == ("535.104.05", "12.2")
    # No UUIDs on a Node: made-up, deterministic per (cluster, node, index), never NVML-looking.
    assert gpu.uuid == synthetic_gpu_id(f"cluster-{kube_cluster.pk}", name, 0)
    assert not gpu.uuid.startswith("GPU-")
    assert {g.pool.slug for g in gpus} == {f"{kube_cluster.slug}-nvidia-h100-80gb-hbm3"}
    assert any(name in change for change in report.changes)

    again = discover_cluster(kube_cluster)
    assert not any(name in change for change in again.changes)
    assert Gpu.objects.filter(node=node).count() == 4


def test_a_not_ready_node_turns_unhealthy_and_the_signal_fires_after_commit(
        kube_cluster, core, health_events, django_capture_on_commit_callbacks):
    name = unique("gpu-flaky")
    make_gpu_node(core, name, gpus=2)
    discover_cluster(kube_cluster)
    node = Node.objects.get(cluster=kube_cluster, name=name)
    assert node.healthy

    set_ready(core, name, False, reason="KubeletNotReady")
    with django_capture_on_commit_callbacks(execute=False) as callbacks:
        report = discover_cluster(kube_cluster)
    assert not health_events, "the signal waits for the commit"
    for callback in callbacks:
        callback()
    node.refresh_from_db()
    assert not node.healthy
    assert node.health_reason == "Kubernetes node NotReady: KubeletNotReady"
    assert {"node_id": node.pk, "healthy": False, "reason": "Kubernetes node NotReady: KubeletNotReady"} in [
        {k: e[k] for k in ("node_id", "healthy", "reason")} for e in health_events]
    assert any(f"node {name} is now unhealthy" in c for c in report.changes)

    health_events.clear()
    set_ready(core, name, True)
    with django_capture_on_commit_callbacks(execute=True):
        discover_cluster(kube_cluster)
    node.refresh_from_db()
    assert node.healthy
    assert [e["healthy"] for e in health_events if e["node_id"] == node.pk] == [True]


def test_a_node_that_disappears_is_kept_but_unhealthy(kube_cluster, core, health_events,
                                                       django_capture_on_commit_callbacks):
    name = unique("gpu-gone")
    make_gpu_node(core, name, gpus=1)
    discover_cluster(kube_cluster)
    core.delete_node(name)
    with django_capture_on_commit_callbacks(execute=True):
        discover_cluster(kube_cluster)
    node = Node.objects.get(cluster=kube_cluster, name=name)
    assert not node.healthy and node.gpus.count() == 1
    assert any(e["node_id"] == node.pk and e["healthy"] is False for e in health_events)


def test_real_uuids_from_an_annotation_and_shared_and_mig_resources(kube_cluster, core):
    name = unique("gpu-ts")
    uuids = ["GPU-11111111-2222-3333-4444-555555555555", "GPU-66666666-7777-8888-9999-000000000000"]
    make_gpu_node(core, name, gpus=2, labels={"nvidia.com/gpu.replicas": "4",
                                              "nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB-SHARED"},
                  annotations={"gpupool.io/gpu-uuids": ",".join(uuids)},
                  extra={"nvidia.com/gpu.shared": "8", "nvidia.com/mig-1g.10gb": "7"})
    discover_cluster(kube_cluster)
    node = Node.objects.get(cluster=kube_cluster, name=name)
    assert sorted(node.gpus.values_list("uuid", flat=True)) == uuids
    assert set(node.gpus.values_list("model_name", flat=True)) == {"NVIDIA-A100-SXM4-80GB"}
    assert node.gpu_resources["allocatable"]["nvidia.com/gpu.shared"] == "8"
    assert node.gpu_resources["capacity"]["nvidia.com/mig-1g.10gb"] == "7"


def test_parse_node_counts_cards_without_gfd_count():
    hami = {"metadata": {"name": "h", "annotations": {
        "hami.io/node-nvidia-register": "GPU-aaa,10,32768,100,NVIDIA-Tesla T4,0,true:GPU-bbb,10,32768,100,"
                                        "NVIDIA-Tesla T4,0,true:"}},
            "status": {"capacity": {"nvidia.com/gpu": "20"}, "conditions": []}}
    parsed = parse_node(hami, cluster_key="c")
    assert [g.uuid for g in parsed.gpus] == ["GPU-aaa", "GPU-bbb"]
    assert parsed.gpus[0].memory_mib == 32768 and parsed.gpus[0].model_name == "NVIDIA-Tesla T4"
    assert not parsed.ready and parsed.health_reason == "Kubernetes node has no Ready condition"
    replicas = {"metadata": {"name": "r", "labels": {"nvidia.com/gpu.replicas": "4"}},
                "status": {"capacity": {"nvidia.com/gpu": "8"},
                           "conditions": [{"type": "Ready", "status": "Unknown", "reason": "NodeStatusUnknown"}]}}
    parsed = parse_node(replicas, cluster_key="c")
    assert len(parsed.gpus) == 2
    twice = {"metadata": {"name": "t", "labels": {"nvidia.com/gpu.count": "2"},
                          "annotations": {"gpupool.io/gpu-uuids": "GPU-same,GPU-same"}}, "status": {}}
    assert [g.uuid for g in parse_node(twice, cluster_key="c").gpus] == [
        synthetic_gpu_id("c", "t", 0), synthetic_gpu_id("c", "t", 1)]
    assert parsed.health_reason == "Kubernetes node Ready=Unknown: NodeStatusUnknown"


def test_discover_endpoint_answers_what_changed(kube_cluster, core, api):
    staff = UserFactory(username="kube-staff", is_staff=True)
    member = UserFactory(username="kube-member")
    name = unique("gpu-api")
    make_gpu_node(core, name, gpus=2)
    assert api(member).post(f"/api/v1/clusters/{kube_cluster.pk}/discover/").status_code == 403
    response = api(staff).post(f"/api/v1/clusters/{kube_cluster.pk}/discover/")
    assert response.status_code == 200, response.content
    body = response.json()
    assert body["cluster"] == kube_cluster.slug and body["nodes"] >= 1
    assert any(name in change for change in body["changes"])
    cluster = api(staff).get(f"/api/v1/clusters/{kube_cluster.pk}/").json()
    assert cluster["last_discovered_at"] and cluster["discovery_error"] == ""


def test_discover_endpoint_names_the_cluster_error(db, control_plane, api):
    from inventory import services

    staff = UserFactory(username="kube-staff2", is_staff=True)
    down = services.cluster_create(actor=staff, name=unique("down"), kind="kubernetes",
                                   kubeconfig=control_plane.kubeconfig_with(server="https://127.0.0.1:9"))
    response = api(staff).post(f"/api/v1/clusters/{down.pk}/discover/")
    assert response.status_code == 503
    assert response.json()["errors"][0]["rule"] == "cluster_unreachable"
    down.refresh_from_db()
    assert "unreachable" in down.discovery_error

    refused = services.cluster_create(actor=staff, name=unique("refused"), kind="kubernetes",
                                      kubeconfig=control_plane.kubeconfig_with(token="not-the-token"))
    response = api(staff).post(f"/api/v1/clusters/{refused.pk}/discover/")
    assert response.status_code == 502
    assert response.json()["errors"][0]["rule"] == "cluster_unauthorized"
    with pytest.raises(ClusterError) as caught:
        discover_cluster(refused)
    assert not caught.value.retryable

    inside = services.cluster_create(actor=staff, name=unique("inside"), kind="kubernetes", in_cluster=True)
    response = api(staff).post(f"/api/v1/clusters/{inside.pk}/discover/")
    assert response.status_code == 502  # the tests do not run in a pod: no service account here
    assert response.json()["errors"][0]["rule"] == "cluster_credentials"
    assert "in-cluster" in response.json()["detail"]

    bare = Cluster.objects.create(name=unique("bare"), slug=unique("bare"), kind="kubernetes")
    response = api(staff).post(f"/api/v1/clusters/{bare.pk}/discover/")
    assert response.status_code == 400 and response.json()["errors"][0]["field"] == "kubeconfig"


def test_the_beat_task_discovers_every_cluster_with_credentials(kube_cluster, core):
    from inventory.tasks import discover_clusters

    name = unique("gpu-beat")
    make_gpu_node(core, name, gpus=1)
    outcome = discover_clusters()
    assert outcome[kube_cluster.slug].endswith("changes")
    assert Node.objects.filter(cluster=kube_cluster, name=name).exists()
