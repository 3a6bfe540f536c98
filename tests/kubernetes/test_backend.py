"""The Kubernetes apply backend against the real API server: quotas, sharing config, reconcile, errors."""
from __future__ import annotations

import json
import time
from datetime import timedelta

import pytest
from django.utils import timezone
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from allocations.apply.backends import kubernetes_manifests as m
from allocations.apply.backends.base import BackendError, BackendRejected
from allocations.apply.backends.kubernetes import KubernetesBackend
from allocations.apply.desired import (
    FIELD_MANAGER,
    MANAGED_BY_LABEL,
    RESERVATIONS_ANNOTATION,
    TEAM_LABEL,
    ClusterDesired,
    Grant,
    PoolDesired,
    TeamDesired,
)
from inventory import services as inventory_services
from common import crypto
from inventory.kubernetes.nodes import parse_quantity
from tests.factories import ClusterFactory, UserFactory
from tests.kubernetes.conftest import make_gpu_node, unique, validate_manifest

ENDS = timezone.now() + timedelta(hours=2)


def grant(reservation_id: int, node: str, index: int = 0, pool: str = "h100", mode: str = "exclusive",
          **extra) -> Grant:
    return Grant(reservation_id=reservation_id, gpu_uuid=f"GPU-{reservation_id}-{node}-{index}", node_name=node,
                 pool_slug=pool, sharing_mode=mode, ends_at=ENDS, **extra)


def desired_for(cluster, teams=(), pools=()) -> ClusterDesired:
    return ClusterDesired(cluster_id=cluster.pk, cluster_slug=cluster.slug, kind="kubernetes", teams=tuple(teams),
                          pools=tuple(pools))


def read_quota(core, namespace):
    return core.read_namespaced_resource_quota(m.QUOTA_NAME, namespace)


def hard(core, namespace) -> dict[str, int]:
    """spec.hard as numbers (the API server writes 8000 back as "8k")."""
    return {k: int(parse_quantity(v)) for k, v in read_quota(core, namespace).spec.hard.items()}


def validate_all(backend: KubernetesBackend) -> None:
    assert backend.sent
    for manifest in backend.sent:
        validate_manifest(manifest)


def test_sync_creates_the_namespace_and_a_quota_of_what_the_team_holds(kube_cluster, core):
    team = unique("vision")
    node = unique("gpu")
    held = TeamDesired(team_slug=team, grants=(grant(11, node, 0), grant(11, node, 1), grant(12, node, 2)))
    pools = (PoolDesired(pool_slug="h100", sharing_mode="exclusive", node_names=(node,)),)
    backend = KubernetesBackend(kube_cluster)
    report = backend.sync(desired_for(kube_cluster, [held], pools), teams=[team])

    namespace = core.read_namespace(f"gpupool-{team}")
    assert namespace.metadata.labels[MANAGED_BY_LABEL] == "gpupool-portal"
    assert namespace.metadata.labels[TEAM_LABEL] == team
    assert namespace.metadata.annotations[RESERVATIONS_ANNOTATION] == "11,12"
    quota = read_quota(core, f"gpupool-{team}")
    assert quota.spec.hard == {"requests.nvidia.com/gpu": "3"}
    assert quota.metadata.labels[TEAM_LABEL] == team
    assert quota.metadata.annotations[RESERVATIONS_ANNOTATION] == "11,12"
    assert any(f.manager == FIELD_MANAGER and f.operation == "Apply" for f in quota.metadata.managed_fields)
    assert report.changed and report.target.endswith(f"(namespace gpupool-{team})")
    assert f"created ResourceQuota gpupool-{team}/gpupool with requests.nvidia.com/gpu=3" in report.changes
    validate_all(backend)

    again = backend.sync(desired_for(kube_cluster, [held], pools), teams=[team])
    assert again.changes == [] and backend.sent == []

    fewer = TeamDesired(team_slug=team, grants=held.grants[:1])
    report = backend.sync(desired_for(kube_cluster, [fewer], pools), teams=[team])
    assert read_quota(core, f"gpupool-{team}").spec.hard == {"requests.nvidia.com/gpu": "1"}
    assert any("requests.nvidia.com/gpu 3 → 1" in change for change in report.changes)


def test_a_team_holding_nothing_gets_zero_for_every_gpu_resource_of_the_cluster(kube_cluster, core):
    team = unique("idle")
    pools = (PoolDesired(pool_slug="ts", sharing_mode="time_slicing", sharing_config={"replicas": 4}),
             PoolDesired(pool_slug="mig", sharing_mode="mig", sharing_config={"profiles": {"1g.10gb": 7}}),
             PoolDesired(pool_slug="hami", sharing_mode="vgpu"))
    KubernetesBackend(kube_cluster).sync(desired_for(kube_cluster, [TeamDesired(team_slug=team)], pools),
                                         teams=[team])
    assert read_quota(core, f"gpupool-{team}").spec.hard == {
        "requests.nvidia.com/gpu": "0", "requests.nvidia.com/gpu.shared": "0", "requests.nvidia.com/gpucores": "0",
        "requests.nvidia.com/gpumem": "0", "requests.nvidia.com/mig-1g.10gb": "0",
        "limits.nvidia.com/gpu": "0", "limits.nvidia.com/gpumem": "0", "limits.nvidia.com/gpucores": "0"}


def test_each_sharing_mode_counts_in_its_own_resource(kube_cluster, core):
    team = unique("modes")
    grants = (grant(1, "n", mode="time_slicing", pool="ts", units=3),
              grant(2, "n", mode="mig", pool="mig", mig_profile="1g.10gb", units=2),
              grant(3, "n", mode="vgpu", pool="hami", units=1, memory_mib=8000, cores_pct=30),
              grant(4, "n", mode="exclusive", pool="h100"))
    backend = KubernetesBackend(kube_cluster)
    backend.sync(desired_for(kube_cluster, [TeamDesired(team_slug=team, grants=grants)]), teams=[team])
    assert hard(core, f"gpupool-{team}") == {
        "requests.nvidia.com/gpu": 2, "requests.nvidia.com/gpu.shared": 3, "requests.nvidia.com/gpumem": 8000,
        "requests.nvidia.com/gpucores": 30, "requests.nvidia.com/mig-1g.10gb": 2,
        # HAMi's extended quota, which its scheduler counts per device.
        "limits.nvidia.com/gpu": 2, "limits.nvidia.com/gpumem": 8000, "limits.nvidia.com/gpucores": 30}
    validate_all(backend)
    assert backend.sync(desired_for(kube_cluster, [TeamDesired(team_slug=team, grants=grants)]),
                        teams=[team]).changes == []


def test_the_api_server_enforces_the_quota_as_soon_as_sync_returns(kube_cluster, core):
    team = unique("enforced")
    node = unique("gpu")
    held = TeamDesired(team_slug=team, grants=(grant(21, node, 0), grant(21, node, 1)))
    KubernetesBackend(kube_cluster).sync(desired_for(kube_cluster, [held]), teams=[team])
    namespace = f"gpupool-{team}"

    def pod(gpus: int) -> dict:
        return {"apiVersion": "v1", "kind": "Pod", "metadata": {"generateName": "train-"},
                "spec": {"automountServiceAccountToken": False, "containers": [
                    {"name": "main", "image": "busybox", "resources": {"limits": {"nvidia.com/gpu": str(gpus)}}}]}}

    with pytest.raises(ApiException) as refused:
        core.create_namespaced_pod(namespace, pod(3), dry_run="All")
    assert refused.value.status == 403 and "exceeded quota" in refused.value.body
    # The ServiceAccount admission needs the controller-made "default" account first.
    deadline = timezone.now() + timedelta(seconds=30)
    while timezone.now() < deadline:
        try:
            core.create_namespaced_pod(namespace, pod(2), dry_run="All")
            break
        except ApiException as exc:
            assert "serviceaccount" in exc.body.lower(), exc.body
            time.sleep(0.2)
    else:
        pytest.fail("a pod within the quota was never admitted")


def test_reconcile_repairs_drift_and_zeroes_teams_that_hold_nothing(kube_cluster, core):
    team, gone = unique("drift"), unique("former")
    node = unique("gpu")
    backend = KubernetesBackend(kube_cluster)
    held = TeamDesired(team_slug=team, grants=(grant(31, node, 0), grant(31, node, 1)))
    former = TeamDesired(team_slug=gone, grants=(grant(32, node, 2),))
    backend.sync(desired_for(kube_cluster, [held, former]), teams=None)
    assert read_quota(core, f"gpupool-{gone}").spec.hard == {"requests.nvidia.com/gpu": "1"}

    # Someone deletes one quota and edits the other by hand.
    core.delete_namespaced_resource_quota(m.QUOTA_NAME, f"gpupool-{team}")
    core.patch_namespaced_resource_quota(m.QUOTA_NAME, f"gpupool-{gone}",
                                         {"spec": {"hard": {"requests.nvidia.com/gpu": "8"}}})
    # The former team is no longer in desired at all: it holds nothing on this cluster now.
    report = backend.sync(desired_for(kube_cluster, [held]), teams=None)
    assert read_quota(core, f"gpupool-{team}").spec.hard == {"requests.nvidia.com/gpu": "2"}
    assert read_quota(core, f"gpupool-{gone}").spec.hard == {"requests.nvidia.com/gpu": "0"}
    assert core.read_namespace(f"gpupool-{gone}").metadata.name == f"gpupool-{gone}"  # never deleted
    assert f"created ResourceQuota gpupool-{team}/gpupool with requests.nvidia.com/gpu=2" in report.changes
    assert any(c.startswith(f"updated ResourceQuota gpupool-{gone}/gpupool") and "8 → 0" in c
               for c in report.changes)

    # A hand edit within the same value range, then reconcile again.
    core.patch_namespaced_resource_quota(m.QUOTA_NAME, f"gpupool-{team}",
                                         {"spec": {"hard": {"requests.nvidia.com/gpu": "5"}}})
    report = backend.sync(desired_for(kube_cluster, [held]), teams=None)
    assert read_quota(core, f"gpupool-{team}").spec.hard == {"requests.nvidia.com/gpu": "2"}
    assert any("requests.nvidia.com/gpu 5 → 2" in c for c in report.changes)
    assert not any(gone in c for c in report.changes)
    assert backend.sync(desired_for(kube_cluster, [held]), teams=None).changes == []
    validate_all(backend) if backend.sent else None


def test_time_slicing_config_map_and_node_labels_and_their_removal(kube_cluster, core):
    ts_node, mig_node, mig2_node = unique("gpu-ts"), unique("gpu-mig"), unique("gpu-mig2")
    for name in (ts_node, mig_node, mig2_node):
        make_gpu_node(core, name, gpus=2)
    ts = PoolDesired(pool_slug=unique("ts"), sharing_mode="time_slicing", sharing_config={"replicas": 4},
                     node_names=(ts_node,))
    mps = PoolDesired(pool_slug=unique("mps"), sharing_mode="mps", sharing_config={"replicas": 2})
    mig = PoolDesired(pool_slug=unique("mig"), sharing_mode="mig", sharing_config={"mig_layout": "all-1g.10gb"},
                      node_names=(mig_node,))
    mixed = PoolDesired(pool_slug=unique("mixed"), sharing_mode="mig",
                        sharing_config={"profiles": {"1g.10gb": 2, "3g.40gb": 1}}, node_names=(mig2_node,))
    missing = PoolDesired(pool_slug=unique("ghost"), sharing_mode="time_slicing", sharing_config={"replicas": 2},
                          node_names=(unique("no-such-node"),))
    backend = KubernetesBackend(kube_cluster)
    pools = [ts, mps, mig, mixed, missing]
    report = backend.sync(desired_for(kube_cluster, pools=pools), teams=[])
    validate_all(backend)

    config = core.read_namespaced_config_map(m.DEVICE_PLUGIN_CONFIGMAP, m.SYSTEM_NAMESPACE)
    key = f"gpupool-{ts.pool_slug}"
    import yaml
    assert yaml.safe_load(config.data[key]) == {"version": "v1", "sharing": {"timeSlicing": {
        "renameByDefault": True, "resources": [{"name": "nvidia.com/gpu", "replicas": 4}]}}}
    assert yaml.safe_load(config.data[f"gpupool-{mps.pool_slug}"])["sharing"]["mps"]["resources"][0]["replicas"] == 2
    labels = core.read_node(ts_node).metadata.labels
    assert labels["nvidia.com/device-plugin.config"] == key and labels["gpupool.io/pool"] == ts.pool_slug
    assert core.read_node(mig_node).metadata.labels["nvidia.com/mig.config"] == "all-1g.10gb"
    assert core.read_node(mig2_node).metadata.labels["nvidia.com/mig.config"] == f"gpupool-{mixed.pool_slug}"
    parted = yaml.safe_load(core.read_namespaced_config_map(m.MIG_PARTED_CONFIGMAP, m.SYSTEM_NAMESPACE)
                            .data["config.yaml"])
    assert parted["mig-configs"][f"gpupool-{mixed.pool_slug}"][0]["mig-devices"] == {"1g.10gb": 2, "3g.40gb": 1}
    assert any(ts_node in c for c in report.changes)
    with pytest.raises(ApiException):
        core.read_node(missing.node_names[0])  # a node is never created by the backend
    # Other labels on the node (GFD's) are untouched.
    assert labels["nvidia.com/gpu.product"] == "NVIDIA-H100-80GB-HBM3"

    assert backend.sync(desired_for(kube_cluster, pools=pools), teams=[]).changes == []

    # The time-slicing pool goes away: reconcile removes its labels and its config entry.
    report = backend.sync(desired_for(kube_cluster, pools=[mps, mig, mixed]), teams=None)
    labels = core.read_node(ts_node).metadata.labels
    assert "nvidia.com/device-plugin.config" not in labels and "gpupool.io/pool" not in labels
    assert labels["nvidia.com/gpu.product"] == "NVIDIA-H100-80GB-HBM3"
    assert key not in core.read_namespaced_config_map(m.DEVICE_PLUGIN_CONFIGMAP, m.SYSTEM_NAMESPACE).data
    assert any(ts_node in c for c in report.changes)
    validate_all(backend)

    # No shared or multi-profile MIG pool left: reconcile empties the portal's ConfigMaps (they stay).
    backend.sync(desired_for(kube_cluster, pools=[]), teams=None)
    assert set(core.read_namespaced_config_map(m.DEVICE_PLUGIN_CONFIGMAP, m.SYSTEM_NAMESPACE).data) == {"default"}
    parted = yaml.safe_load(core.read_namespaced_config_map(m.MIG_PARTED_CONFIGMAP, m.SYSTEM_NAMESPACE)
                            .data["config.yaml"])
    assert parted == {"version": "v1", "mig-configs": {}}
    assert "nvidia.com/mig.config" not in core.read_node(mig_node).metadata.labels
    validate_all(backend)
    assert backend.sync(desired_for(kube_cluster, pools=[]), teams=None).changes == []


def test_errors_map_to_retry_or_reject(db, control_plane):
    staff = UserFactory(username="backend-staff", is_staff=True)
    desired = ClusterDesired(cluster_id=0, cluster_slug="x", kind="kubernetes",
                             teams=(TeamDesired(team_slug="errors"),))
    down = inventory_services.cluster_create(
        actor=staff, name=unique("down"), kind="kubernetes",
        kubeconfig=control_plane.kubeconfig_with(server="https://127.0.0.1:9"))
    with pytest.raises(BackendError) as unreachable:
        KubernetesBackend(down).sync(desired, teams=["errors"])
    assert not isinstance(unreachable.value, BackendRejected)
    assert "unreachable" in str(unreachable.value)

    refused = inventory_services.cluster_create(actor=staff, name=unique("refused"), kind="kubernetes",
                                                kubeconfig=control_plane.kubeconfig_with(token="wrong"))
    with pytest.raises(BackendRejected) as unauthorized:
        KubernetesBackend(refused).sync(desired, teams=["errors"])
    assert "401" in str(unauthorized.value)

    bare = ClusterFactory(slug=unique("bare"), kind="kubernetes")
    with pytest.raises(BackendRejected, match="no kubeconfig"):
        KubernetesBackend(bare).sync(desired, teams=["errors"])


def test_rbac_forbidden_is_rejected(db, control_plane, kube_api):
    """A service account without rights: the API server answers 403, which retrying will not fix."""
    rbac_ns = unique("sa-home")
    core = k8s.CoreV1Api(kube_api)
    core.create_namespace({"metadata": {"name": rbac_ns}})
    core.create_namespaced_service_account(rbac_ns, {"metadata": {"name": "nobody"}})
    # 1.20: the token controller fills a Secret for the account.
    deadline = timezone.now() + timedelta(seconds=30)
    token = None
    while timezone.now() < deadline and token is None:
        for secret in core.list_namespaced_secret(rbac_ns).items:
            if secret.type == "kubernetes.io/service-account-token" and secret.data and secret.data.get("token"):
                import base64
                token = base64.b64decode(secret.data["token"]).decode()
        time.sleep(0.1)
    assert token, "no service account token was issued"
    cluster = ClusterFactory(slug=unique("rbac"), kind="kubernetes",
                             kubeconfig_encrypted=crypto.encrypt(control_plane.kubeconfig_with(token=token)))
    desired = ClusterDesired(cluster_id=cluster.pk, cluster_slug=cluster.slug, kind="kubernetes",
                             teams=(TeamDesired(team_slug="rbac"),))
    with pytest.raises(BackendRejected, match="forbidden"):
        KubernetesBackend(cluster).sync(desired, teams=["rbac"])


def test_manifests_are_pure_and_valid():
    team = TeamDesired(team_slug="Weird_Team.Name", grants=(grant(1, "n"),))
    pools = [PoolDesired(pool_slug="ts", sharing_mode="time_slicing", sharing_config={"replicas": 3},
                         node_names=("n",))]
    manifests = [m.namespace_manifest(team), m.quota_manifest(team, pools), m.system_namespace_manifest(),
                 m.device_plugin_configmap_manifest(pools), m.node_manifest("n", m.node_labels(pools)["n"])]
    for manifest in manifests:
        validate_manifest(manifest)
    assert manifests[0]["metadata"]["name"] == "gpupool-weird-team-name"
    assert json.loads(json.dumps(manifests)) == manifests


def test_the_sharing_configmaps_go_where_the_setting_says(settings, db):
    # With the GPU Operator the device plugin reads its ConfigMap from the operator's namespace.
    from allocations.apply.backends import backend_for
    from tests.factories import ClusterFactory

    settings.KUBE_SYSTEM_NAMESPACE = "gpu-operator"
    assert backend_for(ClusterFactory(slug="east", kind="kubernetes")).system_namespace == "gpu-operator"
