"""Host tokens and what agents may report through them."""
from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone
from rest_framework.test import APIClient

from common.secrets import key_digest
from inventory import services
from inventory.models import Gpu, GpuPool, HostToken, Node
from tests.factories import ClusterFactory, UserFactory


def gpu(i: int, uuid: str | None = None, name: str = "NVIDIA H100 80GB HBM3") -> dict:
    return {"uuid": uuid or f"GPU-aaaaaaaa-0000-0000-0000-00000000000{i}", "index": i, "name": name,
            "memory_mib": 81559, "mig_capable": True, "mig_mode": False, "driver_version": "550.54.15",
            "cuda_version": "12.4"}


def report(gpus: list[dict]) -> dict:
    return {"hostname": "gpu-07", "backend": "simulated", "agent_version": "0.1.0", "gpus": gpus}


@pytest.fixture
def staff(db):
    return UserFactory(username="root", is_staff=True)


@pytest.fixture
def lab(db):
    return ClusterFactory(slug="lab", name="Lab")


@pytest.fixture
def key(staff, lab) -> str:
    client = APIClient()
    client.force_authenticate(staff)
    response = client.post("/api/v1/host-tokens/", {"cluster": "lab", "host_name": "gpu-07"}, format="json")
    assert response.status_code == 201, response.content
    return response.json()["key"]


def agent(key: str) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Host {key}")
    return client


def test_a_token_is_stored_hashed_and_its_key_shown_once(staff, key):
    token = HostToken.objects.get()
    assert token.key_hash == key_digest(key) and key not in token.key_hash
    client = APIClient()
    client.force_authenticate(staff)
    listed = client.get("/api/v1/host-tokens/").json()["results"][0]
    assert "key" not in listed and listed["prefix"] == key[:8]


def test_only_staff_create_tokens_and_only_for_bare_metal(db, lab):
    member = UserFactory(username="someone")
    client = APIClient()
    client.force_authenticate(member)
    assert client.post("/api/v1/host-tokens/", {"cluster": "lab", "host_name": "x"}, format="json").status_code == 403
    ClusterFactory(slug="k8s", kind="kubernetes")
    client.force_authenticate(UserFactory(username="boss", is_staff=True))
    refused = client.post("/api/v1/host-tokens/", {"cluster": "k8s", "host_name": "x"}, format="json")
    assert refused.status_code == 400 and refused.json()["errors"][0]["rule"] == "not_baremetal"


def test_registration_creates_the_host_its_gpus_and_a_pool_per_model(key):
    response = agent(key).post("/api/v1/agent/register/", report([gpu(0), gpu(1), gpu(2, name="NVIDIA L40S")]),
                               format="json")
    assert response.status_code == 200, response.content
    node = Node.objects.get(name="gpu-07")
    assert node.healthy and node.last_seen_at and node.labels["gpupool.io/agent-backend"] == "simulated"
    assert node.gpus.count() == 3
    assert sorted(GpuPool.objects.values_list("slug", flat=True)) == ["lab-nvidia-h100-80gb-hbm3",
                                                                     "lab-nvidia-l40s"]
    assert response.json()["heartbeat_seconds"] > 0


def test_registering_again_refreshes_and_marks_missing_gpus_unhealthy(key):
    client = agent(key)
    client.post("/api/v1/agent/register/", report([gpu(0), gpu(1)]), format="json")
    client.post("/api/v1/agent/register/", report([gpu(1)]), format="json")
    assert dict(Gpu.objects.values_list("index", "healthy")) == {0: False, 1: True}
    assert Gpu.objects.count() == 2  # kept: reservations may point at the missing one


def test_a_wrong_or_revoked_token_is_refused(staff, key):
    assert agent("not-a-key").post("/api/v1/agent/heartbeat/", {}, format="json").status_code == 401
    services.host_token_revoke(actor=staff, token=HostToken.objects.get())
    response = agent(key).post("/api/v1/agent/register/", report([gpu(0)]), format="json")
    assert response.status_code == 401
    assert response.json()["errors"][0]["message"] == "Unknown or revoked host token."


@pytest.mark.parametrize("how", ["service", "admin_save", "delete"])
def test_a_token_that_just_worked_stops_working_once_revoked_or_deleted(staff, key, how):
    # The key's lookup is cached after the first request; any change to the token must drop it.
    assert agent(key).post("/api/v1/agent/register/", report([gpu(0)]), format="json").status_code == 200
    token = HostToken.objects.get()
    if how == "service":
        services.host_token_revoke(actor=staff, token=token)
    elif how == "admin_save":
        token.revoked_at = timezone.now()
        token.save()
    else:
        token.delete()
    assert agent(key).post("/api/v1/agent/heartbeat/", {}, format="json").status_code == 401


def test_user_credentials_do_not_open_the_agent_api(staff):
    client = APIClient()
    client.force_authenticate(staff)
    assert client.post("/api/v1/agent/heartbeat/", {}, format="json").status_code == 403


@pytest.mark.parametrize(("gpus", "field", "rule"), [
    ([gpu(0), gpu(0)], "gpus", "duplicate_uuid"),
    ([gpu(0), {**gpu(1), "index": 0}], "gpus", "duplicate_index"),
    ([{**gpu(0), "uuid": "not-a-uuid"}], "gpus.0.uuid", "invalid"),
    ([{**gpu(0), "memory_mib": -5}], "gpus.0.memory_mib", "min_value"),
    ([{**gpu(0), "index": "first"}], "gpus.0.index", "invalid"),
])
def test_malformed_reports_are_refused_naming_the_field(key, gpus, field, rule):
    response = agent(key).post("/api/v1/agent/register/", report(gpus), format="json")
    assert response.status_code == 400
    assert (field, rule) in [(e["field"], e["rule"]) for e in response.json()["errors"]]
    assert not Node.objects.exists()


def test_an_agent_cannot_claim_another_hosts_gpu(staff, lab, key):
    _, other_key = services.host_token_create(actor=staff, cluster=lab, host_name="gpu-08")
    agent(other_key).post("/api/v1/agent/register/", report([gpu(0)]), format="json")
    response = agent(key).post("/api/v1/agent/register/", report([gpu(0)]), format="json")
    assert response.status_code == 409 and response.json()["errors"][0]["rule"] == "uuid_taken"
    assert Node.objects.get(name="gpu-08").gpus.count() == 1


def test_heartbeat_needs_a_registration_and_revives_a_silent_host(key):
    client = agent(key)
    assert client.post("/api/v1/agent/heartbeat/", {}, format="json").status_code == 404
    client.post("/api/v1/agent/register/", report([gpu(0)]), format="json")
    Node.objects.update(healthy=False, last_seen_at=timezone.now() - timedelta(minutes=5))
    assert client.post("/api/v1/agent/heartbeat/", {}, format="json").status_code == 200
    assert Node.objects.get().healthy


def test_hosts_silent_longer_than_the_timeout_become_unhealthy(key):
    agent(key).post("/api/v1/agent/register/", report([gpu(0)]), format="json")
    assert services.nodes_mark_silent(timeout=timedelta(seconds=60)) == []
    Node.objects.update(last_seen_at=timezone.now() - timedelta(seconds=61))
    node_id = Node.objects.get().pk
    assert services.nodes_mark_silent(timeout=timedelta(seconds=60)) == [node_id]
    assert services.nodes_mark_silent(timeout=timedelta(seconds=60)) == []
    assert not Node.objects.get().healthy


def mig(start: int, profile: str = "1g.10gb", uuid: str | None = None) -> dict:
    return {"uuid": uuid or f"MIG-0000000{start}-aaaa-bbbb", "profile": profile, "start": start, "memory_mib": 9984}


def test_registration_stores_each_gpus_mig_devices_and_keeps_them_when_not_reported(key):
    client = agent(key)
    devices = [mig(3), mig(0, "3g.40gb+me") | {"memory_mib": 40448}]
    response = client.post("/api/v1/agent/register/", report([{**gpu(0), "mig_mode": True, "mig_devices": devices},
                                                               gpu(1)]), format="json")
    assert response.status_code == 200, response.content
    stored = dict(Gpu.objects.values_list("index", "mig_devices"))
    assert stored == {0: sorted(devices, key=lambda d: d["start"]), 1: []}
    client.post("/api/v1/agent/register/", report([gpu(0), gpu(1)]), format="json")  # an agent that reads no MIG
    assert Gpu.objects.get(index=0).mig_devices == stored[0]
    client.post("/api/v1/agent/register/", report([{**gpu(0), "mig_devices": []}, gpu(1)]), format="json")
    assert Gpu.objects.get(index=0).mig_devices == []  # MIG turned off: reported empty


@pytest.mark.parametrize(("devices", "field", "rule"), [
    ([{**mig(0), "uuid": "GPU-00000000-aaaa"}], "gpus.0.mig_devices.0.uuid", "invalid"),
    ([{**mig(0), "profile": "big"}], "gpus.0.mig_devices.0.profile", "invalid"),
    ([mig(8)], "gpus.0.mig_devices.0.start", "max_value"),
    ([{**mig(0), "start": "first"}], "gpus.0.mig_devices.0.start", "invalid"),
    ([{**mig(0), "memory_mib": 0}], "gpus.0.mig_devices.0.memory_mib", "min_value"),
    ([{k: v for k, v in mig(0).items() if k != "profile"}], "gpus.0.mig_devices.0.profile", "required"),
    ([{**mig(0), "slices": 1}], "gpus.0.mig_devices.0.slices", "unknown"),
    ([mig(0), mig(0, uuid="MIG-99999999-aaaa-bbbb")], "gpus.0.mig_devices", "duplicate_start"),
    ([mig(i % 7, uuid=f"MIG-0000000{i}-cccc-dddd") for i in range(9)], "gpus.0.mig_devices", "max_length"),
    ("MIG-0", "gpus.0.mig_devices", "not_a_list"),
])
def test_malformed_mig_devices_are_refused_naming_the_field(key, devices, field, rule):
    response = agent(key).post("/api/v1/agent/register/", report([{**gpu(0), "mig_devices": devices}]), format="json")
    assert response.status_code == 400
    assert (field, rule) in [(e["field"], e["rule"]) for e in response.json()["errors"]], response.json()
    assert not Node.objects.exists()


def test_one_mig_device_reported_on_two_gpus_is_refused(key):
    response = agent(key).post("/api/v1/agent/register/", report([{**gpu(0), "mig_devices": [mig(0)]},
                                                                  {**gpu(1), "mig_devices": [mig(0)]}]), format="json")
    assert response.status_code == 400
    assert response.json()["errors"][0] == {"field": "gpus", "rule": "duplicate_mig_uuid",
                                            "message": "The report lists a MIG device UUID twice."}
