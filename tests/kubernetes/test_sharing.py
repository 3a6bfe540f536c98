"""Sharing on Kubernetes (issue 19): grant rows → grants → quota names per mode, device-plugin and MIG
config, the webhooks in each mode's unit, discovery of shared and MIG capacity. The pure parts run
without a cluster; the rest against the real control plane."""
from __future__ import annotations

import base64
import json
from datetime import timedelta

import pytest
import yaml
from django.utils import timezone
from kubernetes.client.exceptions import ApiException

from allocations.apply.backends import kubernetes_manifests as m
from allocations.apply.backends.kubernetes import KubernetesBackend
from allocations.apply.desired import Grant, PoolDesired, TeamDesired
from allocations.apply.selectors import cluster_desired, team_grants
from allocations.webhooks import pod_gpu_demand, pod_per_device, refusal
from inventory.kubernetes.discovery import discover_cluster
from inventory.kubernetes.nodes import parse_node
from inventory.models import Node
from tests.factories import QuotaFactory, TeamFactory
from tests.kubernetes.conftest import make_gpu_node, unique, validate_manifest
from tests.kubernetes.sharing import H100, active, mig_rows, mig_team, share_rows, shared_pool, vgpu_row
from tests.kubernetes.test_webhooks import MUTATE, VALIDATE, apply_patch, post, response_of, review

ENDS = timezone.now() + timedelta(hours=2)


def grant(mode: str, **extra) -> Grant:
    return Grant(reservation_id=1, gpu_uuid="GPU-1", node_name="n", pool_slug="p", sharing_mode=mode, ends_at=ENDS,
                 **extra)


def pod_with(*containers: dict, init: tuple[dict, ...] = ()) -> dict:
    spec: dict = {"containers": list(containers)}
    if init:
        spec["initContainers"] = list(init)
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}, "spec": spec}


def limits(**named) -> dict:
    return {"name": "c", "image": "busybox", "resources": {"limits": {k: str(v) for k, v in named.items()}}}


# --- pure: manifests -------------------------------------------------------------------------------

def test_a_mig_pool_lists_the_profiles_of_its_layout_for_its_gpu_models():
    balanced = PoolDesired(pool_slug="b", sharing_mode="mig", sharing_config={"mig_layout": "all-balanced"},
                           gpu_models=(H100,))
    assert m.pool_resource_names(balanced) == {"nvidia.com/mig-1g.10gb", "nvidia.com/mig-2g.20gb",
                                               "nvidia.com/mig-3g.40gb"}
    h200 = PoolDesired(pool_slug="b", sharing_mode="mig", sharing_config={"mig_layout": "all-balanced"},
                       gpu_models=("NVIDIA H200",))
    assert m.pool_resource_names(h200) == {"nvidia.com/mig-1g.18gb", "nvidia.com/mig-2g.35gb",
                                           "nvidia.com/mig-3g.71gb"}
    listed = PoolDesired(pool_slug="l", sharing_mode="mig",
                         sharing_config={"profiles": ["3g.40gb", "2g.20gb", "1g.10gb", "1g.10gb"]}, gpu_models=(H100,))
    assert m.pool_resource_names(listed) == {"nvidia.com/mig-3g.40gb", "nvidia.com/mig-2g.20gb",
                                             "nvidia.com/mig-1g.10gb"}
    counted = PoolDesired(pool_slug="c", sharing_mode="mig", sharing_config={"profiles": {"1g.10gb": 7}})
    assert m.pool_resource_names(counted) == {"nvidia.com/mig-1g.10gb"}
    # Models unknown (no GPUs on the cluster yet): an all-<profile> name still names its profile.
    unknown = PoolDesired(pool_slug="u", sharing_mode="mig", sharing_config={"mig_layout": "all-3g.40gb"})
    assert m.pool_resource_names(unknown) == {"nvidia.com/mig-3g.40gb"}


def test_mig_layouts_become_the_label_value_or_a_mig_parted_config():
    named = PoolDesired(pool_slug="n", sharing_mode="mig", sharing_config={"mig_layout": "all-balanced"},
                        gpu_models=(H100,))
    seven = PoolDesired(pool_slug="s", sharing_mode="mig", sharing_config={"profiles": ["1g.10gb"] * 7},
                        gpu_models=(H100,))
    three = PoolDesired(pool_slug="t", sharing_mode="mig", sharing_config={"profiles": ["1g.10gb"] * 3},
                        gpu_models=(H100,))
    mixed = PoolDesired(pool_slug="x", sharing_mode="mig",
                        sharing_config={"profiles": ["3g.40gb", "2g.20gb", "1g.10gb", "1g.10gb"]}, gpu_models=(H100,))
    assert m.mig_config_name(named) == "all-balanced"
    assert m.mig_config_name(seven) == "all-1g.10gb"  # exactly mig-parted's all-1g.10gb on an H100
    assert m.mig_config_name(three) == "gpupool-t"  # three of seven is a layout of its own
    assert m.mig_config_name(mixed) == "gpupool-x"
    parted = m.mig_parted_configmap_manifest([named, seven, three, mixed])
    configs = yaml.safe_load(parted["data"]["config.yaml"])["mig-configs"]
    assert configs == {
        "gpupool-t": [{"devices": "all", "mig-enabled": True, "mig-devices": {"1g.10gb": 3}}],
        "gpupool-x": [{"devices": "all", "mig-enabled": True,
                       "mig-devices": {"1g.10gb": 2, "2g.20gb": 1, "3g.40gb": 1}}]}
    labels = m.node_labels([PoolDesired(pool_slug="n", sharing_mode="mig", node_names=("a",),
                                        sharing_config={"mig_layout": "all-balanced"})])
    assert labels["a"] == {"gpupool.io/pool": "n", "nvidia.com/device-plugin.config": "gpupool-n",
                           "nvidia.com/mig.config": "all-balanced"}
    plugin = m.device_plugin_configmap_manifest([named])
    assert yaml.safe_load(plugin["data"]["gpupool-n"]) == {"version": "v1", "flags": {"migStrategy": "mixed"}}
    for manifest in (parted, plugin):
        validate_manifest(manifest)


def test_each_mode_counts_in_its_unit_and_hami_twice():
    team = TeamDesired(team_slug="t", grants=(
        grant("time_slicing", units=3), grant("mps", units=2, memory_mib=40000, cores_pct=50),
        grant("mig", units=2, mig_profile="3g.40gb", memory_mib=80896),
        grant("vgpu", memory_mib=20000, cores_pct=30), grant("vgpu", memory_mib=10000, cores_pct=20),
        grant("exclusive")))
    hard = m.quota_hard(team, [])
    assert hard == {
        "requests.nvidia.com/gpu": "3", "requests.nvidia.com/gpu.shared": "5", "requests.nvidia.com/mig-3g.40gb": "2",
        "requests.nvidia.com/gpumem": "30000", "requests.nvidia.com/gpucores": "50",
        "limits.nvidia.com/gpu": "3", "limits.nvidia.com/gpumem": "30000", "limits.nvidia.com/gpucores": "50"}
    # No vgpu anywhere: no HAMi names at all.
    assert set(m.quota_hard(TeamDesired(team_slug="t", grants=(grant("mig", mig_profile="1g.10gb"),)), [])) == {
        "requests.nvidia.com/gpu", "requests.nvidia.com/mig-1g.10gb"}
    validate_manifest(m.quota_manifest(team, []))


# --- pure: the webhooks' arithmetic ----------------------------------------------------------------

def test_hami_memory_and_cores_count_once_per_device_and_init_containers_as_kubernetes_does():
    pod = pod_with(limits(**{"nvidia.com/gpu": 2, "nvidia.com/gpumem": 2000, "nvidia.com/gpucores": 20}),
                   limits(**{"nvidia.com/gpumem": 1000}))
    assert pod_gpu_demand(pod) == {"nvidia.com/gpu": 2, "nvidia.com/gpumem": 5000, "nvidia.com/gpucores": 40}
    assert pod_per_device(pod) == [(2, {"nvidia.com/gpumem": 2000, "nvidia.com/gpucores": 20}),
                                   (1, {"nvidia.com/gpumem": 1000})]
    mig = pod_with(limits(**{"nvidia.com/mig-3g.40gb": 1}), limits(**{"nvidia.com/mig-3g.40gb": 1}),
                   init=(limits(**{"nvidia.com/mig-3g.40gb": 3}), limits(**{"nvidia.com/mig-1g.10gb": 1})))
    assert pod_gpu_demand(mig) == {"nvidia.com/mig-3g.40gb": 3, "nvidia.com/mig-1g.10gb": 1}
    # A request wins over a limit; 0 is no demand.
    both = pod_with({"name": "c", "image": "b", "resources": {"requests": {"nvidia.com/gpu.shared": "2"},
                                                              "limits": {"nvidia.com/gpu.shared": "3",
                                                                         "nvidia.com/gpu": "0"}}})
    assert pod_gpu_demand(both) == {"nvidia.com/gpu.shared": 2}


def test_refusals_name_both_amounts_in_the_modes_unit():
    grants = (grant("mig", units=2, mig_profile="3g.40gb"), grant("time_slicing", units=2),
              grant("vgpu", memory_mib=20000, cores_pct=30), grant("vgpu", memory_mib=10000, cores_pct=30))
    assert refusal("vision", {"nvidia.com/mig-3g.40gb": 3}, [], grants) == \
        "pod asks for 3 nvidia.com/mig-3g.40gb; team vision holds 2 nvidia.com/mig-3g.40gb"
    assert refusal("vision", {"nvidia.com/mig-3g.40gb": 2, "nvidia.com/gpu.shared": 2}, [], grants) is None
    assert refusal("vision", {"nvidia.com/gpu.shared": 3}, [], grants) == \
        "pod asks for 3 nvidia.com/gpu.shared; team vision holds 2 nvidia.com/gpu.shared"
    assert refusal("vision", {"nvidia.com/mig-1g.10gb": 1}, [], grants) == \
        "pod asks for 1 nvidia.com/mig-1g.10gb; team vision holds 0 nvidia.com/mig-1g.10gb"
    assert refusal("vision", {"nvidia.com/gpu": 3}, [], grants) == \
        "pod asks for 3 nvidia.com/gpu; team vision holds 2 nvidia.com/gpu"
    # 2 x 15000 = 30000 MiB is all the team holds, but only one of its GPUs has 15000.
    hami = pod_with(limits(**{"nvidia.com/gpu": 2, "nvidia.com/gpumem": 15000}))
    assert refusal("vision", pod_gpu_demand(hami), pod_per_device(hami), grants) == \
        "pod asks for 15000 nvidia.com/gpumem on each of 2 GPUs; team vision holds that much on 1"
    fits = pod_with(limits(**{"nvidia.com/gpu": 1, "nvidia.com/gpumem": 20000, "nvidia.com/gpucores": 30}),
                    limits(**{"nvidia.com/gpu": 1, "nvidia.com/gpumem": 10000, "nvidia.com/gpucores": 30}))
    assert refusal("vision", pod_gpu_demand(fits), pod_per_device(fits), grants) is None


# --- pure: discovery ---------------------------------------------------------------------------------

def test_parse_node_reads_mig_and_shared_setup_from_gfd_labels_and_resources():
    node = {"metadata": {"name": "mig-node", "labels": {
        "nvidia.com/gpu.count": "1", "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3",
        "nvidia.com/mig.strategy": "mixed", "nvidia.com/mig.config": "all-balanced",
        "nvidia.com/mig.config.state": "success",
        "nvidia.com/mig-1g.10gb.count": "2", "nvidia.com/mig-1g.10gb.memory": "9984",
        "nvidia.com/mig-1g.10gb.slices.gi": "1", "nvidia.com/mig-1g.10gb.slices.ci": "1",
        "nvidia.com/mig-1g.10gb.multiprocessors": "16", "nvidia.com/mig-1g.10gb.engines.copy": "1",
        "nvidia.com/mig-1g.10gb.product": "NVIDIA-H100-80GB-HBM3-MIG-1g.10gb",
        "nvidia.com/mig-3g.40gb.count": "1", "nvidia.com/mig-3g.40gb.memory": "40448",
        "nvidia.com/mig-3g.40gb.slices.gi": "3"}},
        "status": {"capacity": {"nvidia.com/gpu": "0", "nvidia.com/mig-1g.10gb": "2", "nvidia.com/mig-3g.40gb": "1",
                                "nvidia.com/mig-2g.20gb": "1"},
                   "allocatable": {"nvidia.com/mig-1g.10gb": "2", "nvidia.com/mig-3g.40gb": "1",
                                   "nvidia.com/mig-2g.20gb": "1"},
                   "conditions": [{"type": "Ready", "status": "True"}]}}
    mig = parse_node(node, cluster_key="c").gpu_resources["mig"]
    assert mig["strategy"] == "mixed" and mig["config"] == "all-balanced" and mig["config_state"] == "success"
    assert mig["profiles"]["1g.10gb"] == {"count": 2, "memory_mib": 9984, "slices_gi": 1, "slices_ci": 1,
                                          "multiprocessors": 16, "engines_copy": 1, "capacity": 2, "allocatable": 2}
    assert mig["profiles"]["3g.40gb"] == {"count": 1, "memory_mib": 40448, "slices_gi": 3, "capacity": 1,
                                          "allocatable": 1}
    assert mig["profiles"]["2g.20gb"] == {"capacity": 1, "allocatable": 1}  # resources without GFD labels
    shared = {"metadata": {"name": "ts", "labels": {"nvidia.com/gpu.count": "2", "nvidia.com/gpu.replicas": "4",
                                                    "nvidia.com/gpu.sharing-strategy": "time-slicing"}},
              "status": {"capacity": {"nvidia.com/gpu.shared": "8"}, "allocatable": {"nvidia.com/gpu.shared": "7"}}}
    resources = parse_node(shared, cluster_key="c").gpu_resources
    assert resources["sharing"] == {"replicas": 4, "strategy": "time-slicing", "shared_capacity": 8,
                                    "shared_allocatable": 7}
    assert "mig" not in resources and "hami" not in resources
    hami = {"metadata": {"name": "h", "labels": {"nvidia.com/gpu.count": "2"}},
            "status": {"capacity": {"nvidia.com/gpu": "20", "nvidia.com/gpumem": "163840",
                                    "nvidia.com/gpucores": "200"}}}
    assert parse_node(hami, cluster_key="c").gpu_resources["hami"] == {"vgpus": 20, "memory_mib": 163840,
                                                                        "cores_pct": 200}


# --- the database: grant rows → grants -------------------------------------------------------------

def test_grant_rows_become_grants_in_each_modes_unit(db, kube_cluster):
    team = TeamFactory(slug=unique("rows"))
    ts_pool, ts_node = shared_pool(kube_cluster, "ts", "time_slicing", {"replicas": 4})
    mps_pool, mps_node = shared_pool(kube_cluster, "mps", "mps", {"replicas": 4})
    v_pool, v_node = shared_pool(kube_cluster, "hami", "vgpu", {})
    ts_gpu, mps_gpu, v_gpu = ts_node.gpus.get(index=0), mps_node.gpus.get(index=1), v_node.gpus.get(index=0)
    share_rows(active(team, ts_pool, mode="time_slicing", gpus=1, shares=3, ge=0.75), ts_gpu, replicas=4,
               slots=[0, 1, 2])
    share_rows(active(team, mps_pool, mode="mps", gpus=1, shares=2, ge=0.5), mps_gpu, replicas=4, slots=[1, 3],
               mode="mps")
    vgpu_row(active(team, v_pool, mode="vgpu", gpus=1, gpu_memory_mib=20000, gpu_cores_pct=30, ge=0.3), v_gpu,
             memory_mib=20000, cores_pct=30)
    _, _, _, mig_reservation = mig_team(kube_cluster, "rows-mig")
    mig_slug = mig_reservation.team.slug

    desired = cluster_desired(kube_cluster)
    mine = {g.sharing_mode: g for g in desired.team(team.slug).grants}
    assert (mine["time_slicing"].units, mine["time_slicing"].gpu_uuid) == (3, ts_gpu.uuid)
    assert (mine["mps"].units, mine["mps"].memory_mib, mine["mps"].cores_pct) == (2, 2 * (81559 // 4), 50)
    assert (mine["vgpu"].units, mine["vgpu"].memory_mib, mine["vgpu"].cores_pct) == (1, 20000, 30)
    mig = desired.team(mig_slug).grants
    assert [(g.mig_profile, g.units, g.memory_mib) for g in mig] == [("3g.40gb", 1, 40448)] * 2
    assert m.team_totals(mig) == {"nvidia.com/mig-3g.40gb": 2}
    # The webhooks read the same grants.
    assert set(team_grants(team.slug, cluster=kube_cluster)[0]) == set(desired.team(team.slug).grants)
    pools = {p.pool_slug: p for p in desired.pools}
    assert pools[mig_reservation.pool.slug].gpu_models == (H100,)
    assert m.quota_hard(desired.team(mig_slug), desired.pools)["requests.nvidia.com/mig-2g.20gb"] == "0"


# --- the real control plane -----------------------------------------------------------------------

def test_a_mig_reservation_is_a_mig_quota_and_the_pools_nodes_get_the_layout(kube_cluster, core):
    team, pool, node, reservation = mig_team(kube_cluster)
    make_gpu_node(core, node.name, gpus=2)
    backend = KubernetesBackend(kube_cluster)
    backend.sync(cluster_desired(kube_cluster), teams=None)
    for manifest in backend.sent:
        validate_manifest(manifest)
    namespace = f"gpupool-{team.slug}"
    hard = core.read_namespaced_resource_quota(m.QUOTA_NAME, namespace).spec.hard
    assert hard["requests.nvidia.com/mig-3g.40gb"] == "2"
    assert hard["requests.nvidia.com/mig-1g.10gb"] == "0" and hard["requests.nvidia.com/mig-2g.20gb"] == "0"
    assert hard["requests.nvidia.com/gpu"] == "0"
    labels = core.read_node(node.name).metadata.labels
    assert labels["nvidia.com/mig.config"] == "all-balanced"
    key = labels["nvidia.com/device-plugin.config"]
    plugin = core.read_namespaced_config_map(m.DEVICE_PLUGIN_CONFIGMAP, m.SYSTEM_NAMESPACE).data[key]
    assert yaml.safe_load(plugin)["flags"] == {"migStrategy": "mixed"}

    def pod(instances: int) -> dict:
        return {"apiVersion": "v1", "kind": "Pod", "metadata": {"generateName": "mig-"},
                "spec": {"automountServiceAccountToken": False, "containers": [
                    {"name": "main", "image": "busybox",
                     "resources": {"limits": {"nvidia.com/mig-3g.40gb": str(instances)}}}]}}

    with pytest.raises(ApiException) as refused:  # the API server's own quota admission
        core.create_namespaced_pod(namespace, pod(3), dry_run="All")
    assert refused.value.status == 403 and "exceeded quota" in refused.value.body
    assert "requests.nvidia.com/mig-3g.40gb=3" in refused.value.body
    assert backend.sync(cluster_desired(kube_cluster), teams=None).changes == []


def test_time_slicing_shares_are_a_shared_quota_and_the_replicas_config(kube_cluster, core):
    team = TeamFactory(slug=unique("ts"))
    pool, node = shared_pool(kube_cluster, "ts", "time_slicing", {"replicas": 4})
    QuotaFactory(team=team, pool=pool, max_ge=2)
    make_gpu_node(core, node.name, gpus=2)
    share_rows(active(team, pool, mode="time_slicing", gpus=1, shares=3, ge=0.75), node.gpus.get(index=0),
               replicas=4, slots=[0, 1, 2])
    KubernetesBackend(kube_cluster).sync(cluster_desired(kube_cluster), teams=[team.slug])
    hard = core.read_namespaced_resource_quota(m.QUOTA_NAME, f"gpupool-{team.slug}").spec.hard
    assert hard["requests.nvidia.com/gpu.shared"] == "3" and hard["requests.nvidia.com/gpu"] == "0"
    key = core.read_node(node.name).metadata.labels["nvidia.com/device-plugin.config"]
    config = yaml.safe_load(core.read_namespaced_config_map(m.DEVICE_PLUGIN_CONFIGMAP, m.SYSTEM_NAMESPACE).data[key])
    assert config["sharing"]["timeSlicing"]["resources"] == [{"name": "nvidia.com/gpu", "replicas": 4}]


def test_a_vgpu_reservation_is_hamis_quota(kube_cluster, core):
    team = TeamFactory(slug=unique("hq"))
    pool, node = shared_pool(kube_cluster, "hq", "vgpu", {})
    reservation = active(team, pool, mode="vgpu", gpus=2, gpu_memory_mib=20000, gpu_cores_pct=25, ge=0.5)
    for gpu in node.gpus.all():
        vgpu_row(reservation, gpu, memory_mib=20000, cores_pct=25)
    backend = KubernetesBackend(kube_cluster)
    backend.sync(cluster_desired(kube_cluster), teams=[team.slug])
    for manifest in backend.sent:
        validate_manifest(manifest)
    quota = core.read_namespaced_resource_quota(m.QUOTA_NAME, f"gpupool-{team.slug}")
    assert {k: v for k, v in quota.spec.hard.items() if "nvidia.com/gpu" not in k or "gpumem" in k
            or "gpucores" in k} == {
        "requests.nvidia.com/gpumem": "40k", "requests.nvidia.com/gpucores": "50",
        "limits.nvidia.com/gpumem": "40k", "limits.nvidia.com/gpucores": "50"}
    assert quota.spec.hard["limits.nvidia.com/gpu"] == "2" and quota.spec.hard["requests.nvidia.com/gpu"] == "2"
    assert quota.status.hard == quota.spec.hard  # taken in by the quota controller: in force


def test_webhooks_pin_hami_pods_to_the_uuids_and_refuse_over_asking_in_each_unit(kube_cluster, core):
    team, pool, node, _ = mig_team(kube_cluster, "hook")
    v_pool, v_node = shared_pool(kube_cluster, "hook-v", "vgpu", {})
    gpu = v_node.gpus.get(index=1)
    vgpu_row(active(team, v_pool, mode="vgpu", gpus=1, gpu_memory_mib=20000, gpu_cores_pct=30, ge=0.3), gpu,
             memory_mib=20000, cores_pct=30)
    namespace = f"gpupool-{team.slug}"
    KubernetesBackend(kube_cluster).sync(cluster_desired(kube_cluster), teams=[team.slug])

    hami = pod_with(limits(**{"nvidia.com/gpu": 1, "nvidia.com/gpumem": 20000, "nvidia.com/gpucores": 30}))
    answer = response_of(post(MUTATE, review(hami, namespace)))
    patched = apply_patch(hami, json.loads(base64.b64decode(answer["patch"])))
    assert patched["metadata"]["annotations"]["nvidia.com/use-gpuuuid"] == gpu.uuid
    terms = patched["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"]
    assert terms[0]["matchExpressions"][0]["values"] == [v_node.name]  # not the MIG node
    assert response_of(post(VALIDATE, review(hami, namespace)))["allowed"] is True
    patched["metadata"]["namespace"] = namespace
    validate_manifest(patched)
    core.create_namespaced_pod(namespace, {**patched, "metadata": {**patched["metadata"], "name": unique("hami")}},
                               dry_run="All")

    mig = pod_with(limits(**{"nvidia.com/mig-3g.40gb": 1}))
    pinned = apply_patch(mig, json.loads(base64.b64decode(response_of(post(MUTATE, review(mig, namespace)))["patch"])))
    assert "nvidia.com/use-gpuuuid" not in pinned["metadata"]["annotations"]
    assert pinned["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"][0]["matchExpressions"][0]["values"] == [node.name]

    for asked, message in (
            ({"nvidia.com/mig-3g.40gb": 3}, f"pod asks for 3 nvidia.com/mig-3g.40gb; team {team.slug} holds 2"),
            ({"nvidia.com/mig-1g.10gb": 1}, f"pod asks for 1 nvidia.com/mig-1g.10gb; team {team.slug} holds 0"),
            ({"nvidia.com/gpu": 1, "nvidia.com/gpumem": 30000},
             f"pod asks for 30000 nvidia.com/gpumem; team {team.slug} holds 20000"),
            ({"nvidia.com/gpu": 2, "nvidia.com/gpumem": 10000}, "pod asks for 2 nvidia.com/gpu; team")):
        answer = response_of(post(VALIDATE + kube_cluster.slug + "/", review(pod_with(limits(**asked)), namespace)))
        assert answer["allowed"] is False and message in answer["status"]["message"], answer


def test_discovery_stores_mig_and_shared_capacity(kube_cluster, core):
    name = unique("gpu-mig")
    make_gpu_node(core, name, gpus=1, labels={
        "nvidia.com/mig.strategy": "mixed", "nvidia.com/mig.config": "all-balanced",
        "nvidia.com/mig.config.state": "success", "nvidia.com/mig-3g.40gb.count": "1",
        "nvidia.com/mig-3g.40gb.memory": "40448", "nvidia.com/mig-3g.40gb.slices.gi": "3"},
        extra={"nvidia.com/gpu": "0", "nvidia.com/mig-3g.40gb": "1", "nvidia.com/mig-1g.10gb": "2"})
    discover_cluster(kube_cluster)
    node = Node.objects.get(cluster=kube_cluster, name=name)
    assert node.gpus.count() == 1
    assert node.labels["nvidia.com/mig.config"] == "all-balanced"
    mig = node.gpu_resources["mig"]
    assert (mig["strategy"], mig["config"], mig["config_state"]) == ("mixed", "all-balanced", "success")
    assert mig["profiles"]["3g.40gb"] == {"count": 1, "memory_mib": 40448, "slices_gi": 3, "capacity": 1,
                                          "allocatable": 1}
    assert mig["profiles"]["1g.10gb"] == {"capacity": 2, "allocatable": 2}


# --- dynamic MIG layout ---------------------------------------------------------------------------

def test_a_dynamic_mig_pools_nodes_each_get_their_layout_as_a_mig_parted_config():
    pool = PoolDesired(pool_slug="d", sharing_mode="mig", sharing_config={"dynamic": True}, node_names=("a", "b", "c"),
                       gpu_models=(H100,), mig_gpus=(("a", 0, H100, ("3g.40gb", "1g.10gb")), ("a", 1, H100, ()),
                                                     ("b", 0, H100, ("1g.10gb", "3g.40gb")), ("b", 1, H100, ()),
                                                     ("c", 0, H100, ("7g.80gb",)), ("c", 1, H100, ())))
    assert m.pool_resource_names(pool) == {f"nvidia.com/mig-{p}" for p in (
        "1g.10gb", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb")}
    labels = m.node_labels([pool])
    assert labels["a"]["nvidia.com/mig.config"] == labels["b"]["nvidia.com/mig.config"]  # the same layout
    assert labels["c"]["nvidia.com/mig.config"] != labels["a"]["nvidia.com/mig.config"]
    assert all(label["nvidia.com/mig.config"].startswith("gpupool-d-") for label in labels.values())
    parted = m.mig_parted_configmap_manifest([pool])
    validate_manifest(parted)
    configs = yaml.safe_load(parted["data"]["config.yaml"])["mig-configs"]
    assert configs[labels["a"]["nvidia.com/mig.config"]] == [
        {"devices": [0], "mig-enabled": True, "mig-devices": {"1g.10gb": 1, "3g.40gb": 1}},
        {"devices": [1], "mig-enabled": True, "mig-devices": {}}]  # idle, no layout of its own: all-enabled
    idle_balanced = PoolDesired(pool_slug="d", sharing_mode="mig", node_names=("a",), gpu_models=(H100,),
                                sharing_config={"dynamic": True, "mig_layout": "all-balanced"},
                                mig_gpus=(("a", 0, H100, ()),))
    (config,) = yaml.safe_load(m.mig_parted_configmap_manifest([idle_balanced])["data"]["config.yaml"])[
        "mig-configs"].values()
    assert config == [{"devices": [0], "mig-enabled": True,
                       "mig-devices": {"1g.10gb": 2, "2g.20gb": 1, "3g.40gb": 1}}]


def test_a_dynamic_mig_nodes_label_follows_its_grants_on_the_api_server(kube_cluster, core):
    team = TeamFactory(slug=unique("dmig"))
    pool, node = shared_pool(kube_cluster, "dmig", "mig", {"dynamic": True}, gpus=2)
    QuotaFactory(team=team, pool=pool, max_ge=4)
    make_gpu_node(core, node.name, gpus=2)
    backend = KubernetesBackend(kube_cluster)
    backend.sync(cluster_desired(kube_cluster), teams=None)
    idle = core.read_node(node.name).metadata.labels["nvidia.com/mig.config"]

    def parted(name: str) -> list[dict]:
        document = core.read_namespaced_config_map(m.MIG_PARTED_CONFIGMAP, m.SYSTEM_NAMESPACE).data["config.yaml"]
        return yaml.safe_load(document)["mig-configs"][name]

    assert [entry["mig-devices"] for entry in parted(idle)] == [{}, {}]
    reservation = active(team, pool, mode="mig", gpus=1, mig_profile="3g.40gb", mig_count=2, ge=6 / 7)
    gpu = node.gpus.order_by("index").first()
    mig_rows(reservation, gpu, "3g.40gb", ["3g.40gb", "3g.40gb"], 2)
    backend.sync(cluster_desired(kube_cluster), teams=[team.slug])  # one team's apply writes the node's layout
    for manifest in backend.sent:
        validate_manifest(manifest)
    carved = core.read_node(node.name).metadata.labels["nvidia.com/mig.config"]
    assert carved != idle and parted(carved) == [
        {"devices": [0], "mig-enabled": True, "mig-devices": {"3g.40gb": 2}},
        {"devices": [1], "mig-enabled": True, "mig-devices": {}}]
    hard = core.read_namespaced_resource_quota(m.QUOTA_NAME, f"gpupool-{team.slug}").spec.hard
    assert hard["requests.nvidia.com/mig-3g.40gb"] == "2" and hard["requests.nvidia.com/mig-7g.80gb"] == "0"
    assert backend.sync(cluster_desired(kube_cluster), teams=None).changes == []  # idempotent
    reservation.delete()  # the grants end: the node goes back to its idle layout
    backend.sync(cluster_desired(kube_cluster), teams=None)
    assert core.read_node(node.name).metadata.labels["nvidia.com/mig.config"] == idle
