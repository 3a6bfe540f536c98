"""A reservation's detail says how a job uses it once active: the GPUs as CUDA_VISIBLE_DEVICES on a
host, the team's namespace on Kubernetes; nothing before it is active."""
from __future__ import annotations

from allocations.models import Reservation
from inventory.models import Cluster
from tests.factories import window


def _book(api, world, gpus=2):
    answer = api(world.member).post("/api/v1/reservations/", {"pool": "a100", "team": "ml", "gpus": gpus,
                                                             "ends_at": window(0, 2)[1].isoformat()}, format="json")
    assert answer.status_code == 201
    return answer.json()["id"]


def test_an_active_host_reservation_names_its_gpus_for_cuda(world, api):
    rid = _book(api, world)
    assert api(world.member).get(f"/api/v1/reservations/{rid}/").json()["environment"] is None  # scheduled
    Reservation.objects.filter(pk=rid).update(state="active")
    Cluster.objects.update(kind=Cluster.Kind.BAREMETAL)
    detail = api(world.member).get(f"/api/v1/reservations/{rid}/").json()
    uuids = [g["uuid"] for g in detail["grants"]]
    env = detail["environment"]
    assert env["where"] == "host" and env["namespace"] is None
    assert env["variables"]["CUDA_VISIBLE_DEVICES"] == ",".join(uuids)
    assert env["variables"]["GPUPOOL_RESERVATION"] == str(rid)
    assert env["variables"]["GPUPOOL_TEAM"] == "ml"
    assert env["nodes"] == sorted({g["node"] for g in detail["grants"]})


def test_on_kubernetes_it_names_the_teams_namespace(world, api):
    rid = _book(api, world, gpus=1)
    Reservation.objects.filter(pk=rid).update(state="active")
    Cluster.objects.update(kind=Cluster.Kind.KUBERNETES)
    env = api(world.member).get(f"/api/v1/reservations/{rid}/").json()["environment"]
    assert env["where"] == "kubernetes" and env["namespace"] == "gpupool-ml"
    assert "CUDA_VISIBLE_DEVICES" not in env["variables"]
