"""The inventory app in Simplified Chinese (issue 23): refusals about clusters, nodes, pools, GPU models
and host agents speak the request's language, `field` and `rule` unchanged; the admin's labels too."""
from __future__ import annotations

import pytest
from django.core.exceptions import ValidationError
from django.test import Client
from django.utils import translation
from rest_framework.test import APIClient

from inventory.models import Cluster, GpuPool
from inventory.services import gpu_model_weight_set, host_token_create

pytestmark = pytest.mark.django_db
ZH = {"HTTP_ACCEPT_LANGUAGE": "zh-hans"}
EN = {"HTTP_ACCEPT_LANGUAGE": "en"}


@pytest.mark.parametrize(("headers", "message"), [
    (ZH, "只有 Kubernetes 集群才能设置遥测来源（主机运行代理程序）。"),
    (EN, "Only Kubernetes clusters take a telemetry source (hosts run the agent)."),
])
def test_a_bad_cluster_field_is_refused_in_the_requests_language(world, api, headers, message):
    refused = api(world.staff).post("/api/v1/clusters/", {"name": "rack", "kind": "baremetal",
                                                          "telemetry_source": "prometheus"}, format="json", **headers)
    assert refused.status_code == 400
    assert refused.json()["errors"] == [{"field": "telemetry_source", "rule": "not_kubernetes", "message": message}]


@pytest.mark.parametrize(("headers", "message"), [
    (ZH, "标签必须是字符串键到字符串值的对象。"),
    (EN, "Labels must be an object of string keys to string values."),
])
def test_a_bad_node_field_is_refused_in_the_requests_language(world, api, headers, message):
    refused = api(world.staff).post("/api/v1/nodes/", {"cluster": "lab", "name": "node-z", "labels": {"a": 1}},
                                    format="json", **headers)
    assert refused.status_code == 400
    assert refused.json()["errors"] == [{"field": "labels", "rule": "invalid", "message": message}]


def test_a_kubeconfig_refusal_is_one_translated_sentence(world, api):
    refused = api(world.staff).post("/api/v1/clusters/", {"name": "k8s", "kind": "kubernetes",
                                                          "kubeconfig": "apiVersion: v1\nkind: Config\n"},
                                    format="json", **ZH)
    assert refused.json()["errors"] == [{"field": "kubeconfig", "rule": "no_current_context",
                                         "message": "kubeconfig：没有 current-context。"}]


def test_a_gpu_model_and_a_host_agent_are_refused_in_chinese(world, api):
    missing = api(world.staff).patch("/api/v1/gpu-models/Nope%20X/", {"weight": 0.5}, format="json", **ZH)
    assert missing.status_code == 404
    assert missing.json()["errors"] == [{"field": "name", "rule": "does_not_exist",
                                         "message": "资源清单中没有型号为 'Nope X' 的 GPU。"}]
    agent = APIClient()
    agent.credentials(HTTP_AUTHORIZATION="Host not-a-key")
    unknown = agent.post("/api/v1/agent/heartbeat/", **ZH)
    assert unknown.status_code == 401 and unknown.json()["errors"][0]["message"] == "主机令牌未知或已吊销。"
    assert APIClient(HTTP_AUTHORIZATION="Host not-a-key").post(
        "/api/v1/agent/heartbeat/").json()["errors"][0]["message"] == "Unknown or revoked host token."


def test_a_pools_sharing_config_problems_in_chinese(world):
    pool = GpuPool(name="ts", slug="ts", sharing_mode="time_slicing", sharing_config={"replicas": 1, "x": 2})
    with translation.override("zh-hans"), pytest.raises(ValidationError) as refused:
        pool.full_clean()
    assert refused.value.message_dict["sharing_config"] == ["模式 time_slicing 不支持键 'x'",
                                                            "replicas 必须是 2 到 64 之间的整数"]
    with pytest.raises(ValidationError) as refused:
        pool.full_clean()
    assert refused.value.message_dict["sharing_config"][1] == "replicas must be an integer from 2 to 64"


def test_the_inventory_admin_changelists_in_chinese(world):
    model = world.pool.gpus.first().model_name
    gpu_model_weight_set(actor=world.staff, name=model, weight="0.5")
    host_token_create(actor=world.staff, cluster=Cluster.objects.get(slug="lab"), host_name="node-a")
    client = Client()
    client.force_login(world.staff)
    pools = client.get("/admin/inventory/gpupool/", **ZH).content.decode()
    assert "GPU 资源池" in pools and "共享模式" in pools and "放置策略" in pools and "独占（整块 GPU）" in pools
    nodes = client.get("/admin/inventory/node/", **ZH).content.decode()
    assert "资源清单：集群、节点、GPU 与资源池" in nodes and "可调度" in nodes and "最近上报时间" in nodes
    tokens = client.get("/admin/inventory/hosttoken/", **ZH).content.decode()
    assert "吊销所选令牌" in tokens
    models = client.get("/admin/inventory/gpumodel/", **ZH).content.decode()
    assert "GPU 型号" in models and "权重" in models
    english = client.get("/admin/inventory/gpupool/", **EN).content.decode()
    assert "GPU pools" in english and "Sharing mode" in english and "Exclusive (whole GPUs)" in english
