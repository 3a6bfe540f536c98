"""Admission webhooks with real admission.k8s.io/v1 AdmissionReview bodies; patched pods go to the real API server."""
from __future__ import annotations

import base64
import copy
import io
import json
import uuid
from datetime import timedelta

import pytest
import yaml
from django.core.management import CommandError, call_command
from django.test import Client
from django.utils import timezone
from kubernetes import client as k8s

from allocations.apply.backends.kubernetes import KubernetesBackend
from allocations.apply.selectors import cluster_desired
from allocations.models import Allocation, Reservation
from tests.factories import PoolFactory, QuotaFactory, TeamFactory, add_node
from tests.kubernetes.conftest import unique, validate_manifest

MUTATE, VALIDATE = "/webhooks/kubernetes/mutate-pods/", "/webhooks/kubernetes/validate-pods/"


def review(pod: dict, namespace: str, *, operation: str = "CREATE", api_version: str = "admission.k8s.io/v1") -> dict:
    """An AdmissionReview as kube-apiserver 1.20 sends it for a pod CREATE."""
    gvk = {"group": "", "version": "v1", "kind": "Pod"}
    gvr = {"group": "", "version": "v1", "resource": "pods"}
    return {"apiVersion": api_version, "kind": "AdmissionReview", "request": {
        "uid": str(uuid.uuid4()), "kind": gvk, "resource": gvr, "requestKind": gvk, "requestResource": gvr,
        "name": pod["metadata"].get("name", ""), "namespace": namespace, "operation": operation,
        "userInfo": {"username": "kubernetes-admin", "groups": ["system:masters", "system:authenticated"]},
        "object": pod, "oldObject": None, "dryRun": False,
        "options": {"apiVersion": "meta.k8s.io/v1", "kind": "CreateOptions"}}}


def gpu_pod(gpus: int = 1, *, resource: str = "nvidia.com/gpu", affinity: dict | None = None,
            annotations: dict | None = None) -> dict:
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": f"train-{uuid.uuid4().hex[:5]}"},
           "spec": {"automountServiceAccountToken": False, "containers": [
               {"name": "main", "image": "busybox", "resources": {"limits": {resource: str(gpus)}}}]}}
    if affinity is not None:
        pod["spec"]["affinity"] = affinity
    if annotations is not None:
        pod["metadata"]["annotations"] = annotations
    return pod


def post(path: str, body, **headers):
    response = Client(enforce_csrf_checks=True).post(path, data=json.dumps(body), content_type="application/json",
                                                     **headers)
    return response


def apply_patch(document: dict, operations: list[dict]) -> dict:
    """A small RFC 6902 applier for the `add` operations the webhook sends."""
    document = copy.deepcopy(document)
    for op in operations:
        assert op["op"] == "add"
        parts = [p.replace("~1", "/").replace("~0", "~") for p in op["path"].lstrip("/").split("/")]
        target = document
        for part in parts[:-1]:
            target = target[int(part)] if isinstance(target, list) else target[part]
        last = parts[-1]
        if isinstance(target, list):
            target.append(op["value"]) if last == "-" else target.insert(int(last), op["value"])
        else:
            target[last] = op["value"]
    return document


def response_of(http) -> dict:
    assert http.status_code == 200, http.content
    body = http.json()
    assert body["apiVersion"] == "admission.k8s.io/v1" and body["kind"] == "AdmissionReview"
    return body["response"]


@pytest.fixture
def holding(kube_cluster, core):
    """Team `ml-…` holds 2 GPUs on node A and 1 on node B of the Kubernetes cluster (an active reservation each)."""
    team = TeamFactory(slug=unique("ml"))
    pool = PoolFactory(slug=unique("h100"))
    node_a = add_node(pool, unique("node-a"), 4, cluster=kube_cluster)
    node_b = add_node(pool, unique("node-b"), 4, cluster=kube_cluster)
    QuotaFactory(team=team, pool=pool, max_ge=8)
    now = timezone.now()
    reservations = []
    for node, count in ((node_a, 2), (node_b, 1)):
        reservation = Reservation.objects.create(team=team, pool=pool, gpus=count, starts_at=now - timedelta(minutes=5),
                                                 ends_at=now + timedelta(hours=2), state=Reservation.State.ACTIVE)
        for gpu in node.gpus.order_by("index")[:count]:
            Allocation.objects.create(reservation=reservation, gpu=gpu, starts_at=reservation.starts_at,
                                      ends_at=reservation.ends_at)
        reservations.append(reservation)
    # The backend makes the namespace and quota from the same database state.
    KubernetesBackend(kube_cluster).sync(cluster_desired(kube_cluster), teams=[team.slug])
    return {"team": team, "namespace": f"gpupool-{team.slug}", "nodes": sorted([node_a.name, node_b.name]),
            "reservations": reservations, "pool": pool, "cluster": kube_cluster}


def test_mutate_pins_a_gpu_pod_to_the_teams_nodes_and_the_api_server_accepts_it(holding, core):
    pod = gpu_pod(2)
    answer = response_of(post(MUTATE + holding["cluster"].slug + "/", review(pod, holding["namespace"])))
    assert answer["allowed"] is True and answer["patchType"] == "JSONPatch"
    patched = apply_patch(pod, json.loads(base64.b64decode(answer["patch"])))
    terms = patched["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"]
    assert terms == [{"matchExpressions": [{"key": "kubernetes.io/hostname", "operator": "In",
                                            "values": holding["nodes"]}]}]
    ids = ",".join(str(r.pk) for r in sorted(holding["reservations"], key=lambda r: r.pk))
    assert patched["metadata"]["annotations"]["gpupool.io/reservations"] == ids
    validate_manifest(patched)
    created = core.create_namespaced_pod(holding["namespace"], patched, dry_run="All")
    assert created.spec.affinity.node_affinity.required_during_scheduling_ignored_during_execution \
        .node_selector_terms[0].match_expressions[0].values == holding["nodes"]


def test_mutate_narrows_an_existing_affinity_instead_of_replacing_it(holding):
    own = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]},
        {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["x"]}]},
        {}]}},
        "podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": []}}
    pod = gpu_pod(1, affinity=own, annotations={"team.example/owner": "alice"})
    answer = response_of(post(MUTATE, review(pod, holding["namespace"])))
    patched = apply_patch(pod, json.loads(base64.b64decode(answer["patch"])))
    ours = {"key": "kubernetes.io/hostname", "operator": "In", "values": holding["nodes"]}
    terms = patched["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"]
    assert terms[0]["matchExpressions"] == [{"key": "zone", "operator": "In", "values": ["a"]}, ours]
    assert terms[1] == {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["x"]}],
                        "matchExpressions": [ours]}
    assert terms[2] == {}  # an empty term matches nothing; it stays so
    assert "podAntiAffinity" in patched["spec"]["affinity"]
    assert patched["metadata"]["annotations"]["team.example/owner"] == "alice"

    # Asked again with the pinned pod (reinvocation): nothing more to add.
    again = response_of(post(MUTATE, review(patched, holding["namespace"])))
    assert "patch" not in again


def test_pods_outside_team_namespaces_or_without_gpus_pass_untouched(holding):
    for namespace, pod in (("default", gpu_pod(1)), ("kube-system", gpu_pod(4)),
                           (holding["namespace"], {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "web"},
                                                   "spec": {"containers": [{"name": "c", "image": "nginx"}]}})):
        for path in (MUTATE, VALIDATE):
            answer = response_of(post(path, review(pod, namespace)))
            assert answer["allowed"] is True and "patch" not in answer
    answer = response_of(post(MUTATE, review(gpu_pod(1), holding["namespace"], operation="UPDATE")))
    assert answer == {"uid": answer["uid"], "allowed": True}


def test_validate_refuses_a_pod_asking_for_more_than_the_team_holds(holding):
    body = review(gpu_pod(4), holding["namespace"])
    answer = response_of(post(VALIDATE + holding["cluster"].slug + "/", body))
    assert answer["uid"] == body["request"]["uid"]
    assert answer["allowed"] is False and answer["status"]["code"] == 403
    message = answer["status"]["message"]
    assert f"team {holding['team'].slug} holds 3 nvidia.com/gpu" in message and "asks for 4" in message
    assert response_of(post(VALIDATE, review(gpu_pod(3), holding["namespace"])))["allowed"] is True
    # Init containers run before the others: the largest one counts if it is bigger than the sum.
    pod = gpu_pod(1)
    pod["spec"]["initContainers"] = [{"name": "warmup", "image": "busybox",
                                      "resources": {"limits": {"nvidia.com/gpu": "5"}}}]
    assert response_of(post(VALIDATE, review(pod, holding["namespace"])))["allowed"] is False
    # A resource the team holds none of (time-sliced shares here).
    shared = response_of(post(VALIDATE, review(gpu_pod(1, resource="nvidia.com/gpu.shared"), holding["namespace"])))
    assert shared["allowed"] is False and "holds 0 nvidia.com/gpu.shared" in shared["status"]["message"]


def test_a_team_holding_nothing_is_refused_and_not_pinned(db, kube_cluster):
    team = TeamFactory(slug=unique("empty"))
    namespace = f"gpupool-{team.slug}"
    assert "patch" not in response_of(post(MUTATE, review(gpu_pod(1), namespace)))
    answer = response_of(post(VALIDATE, review(gpu_pod(1), namespace)))
    assert answer["allowed"] is False and "holds 0 nvidia.com/gpu" in answer["status"]["message"]


def test_hami_pools_get_the_reserved_gpu_uuids(db, kube_cluster):
    team = TeamFactory(slug=unique("hami"))
    pool = PoolFactory(slug=unique("vgpu"), sharing_mode="vgpu")
    node = add_node(pool, unique("node-v"), 2, cluster=kube_cluster)
    now = timezone.now()
    reservation = Reservation.objects.create(team=team, pool=pool, gpus=2, starts_at=now - timedelta(minutes=1),
                                             ends_at=now + timedelta(hours=1), state=Reservation.State.ACTIVE)
    gpus = list(node.gpus.all())
    for gpu in gpus:  # the grant rows of a vgpu reservation: one per GPU, with its memory and cores
        Allocation.objects.create(reservation=reservation, gpu=gpu, starts_at=reservation.starts_at,
                                  ends_at=reservation.ends_at, mode="vgpu", memory_mib=40000, cores_pct=50,
                                  milli=500, ge=0.5)
    pod = gpu_pod(1, annotations={})
    answer = response_of(post(MUTATE, review(pod, f"gpupool-{team.slug}")))
    patched = apply_patch(pod, json.loads(base64.b64decode(answer["patch"])))
    assert patched["metadata"]["annotations"]["nvidia.com/use-gpuuuid"] == ",".join(sorted(g.uuid for g in gpus))


def test_the_webhook_token_is_required_when_set(holding, settings):
    settings.KUBE_WEBHOOK_TOKEN = "s3cret-token"
    body = review(gpu_pod(1), holding["namespace"])
    slug = holding["cluster"].slug
    assert post(MUTATE, body).status_code == 401
    assert post(f"{MUTATE}{slug}/wrong/", body).status_code == 401
    assert post(MUTATE, body, HTTP_AUTHORIZATION="Bearer wrong").status_code == 401
    assert response_of(post(MUTATE, body, HTTP_AUTHORIZATION="Bearer s3cret-token"))["allowed"] is True
    assert response_of(post(f"{VALIDATE}{slug}/s3cret-token/", body))["allowed"] is True
    assert response_of(post(f"{VALIDATE}{slug}/s3cret-token", body))["allowed"] is True  # no trailing slash


def test_bad_requests_are_4xx_json(db):
    client = Client()
    assert client.get(MUTATE).status_code == 405
    assert client.post(MUTATE, data="not json", content_type="application/json").status_code == 400
    old = review(gpu_pod(1), "gpupool-x", api_version="admission.k8s.io/v1beta1")
    response = post(VALIDATE, old)
    assert response.status_code == 400 and "admission.k8s.io/v1" in response.json()["detail"]
    assert post(MUTATE, {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview"}).status_code == 400
    assert post(MUTATE + "no-such-cluster/", review(gpu_pod(1), "gpupool-x")).status_code == 404


def test_kube_webhook_config_prints_configurations_the_api_server_accepts(control_plane, kube_api, settings, db):
    out = io.StringIO()
    call_command("kube_webhook_config", "--url", "https://portal.example/",
                 "--ca-file", str(control_plane.dir / "pki" / "ca.crt"), "--cluster", "east", stdout=out)
    documents = list(yaml.safe_load_all(out.getvalue()))
    assert [d["kind"] for d in documents] == ["MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"]
    mutating, validating = documents[0]["webhooks"][0], documents[1]["webhooks"][0]
    assert mutating["clientConfig"]["url"] == "https://portal.example/webhooks/kubernetes/mutate-pods/east"
    assert validating["clientConfig"]["url"] == "https://portal.example/webhooks/kubernetes/validate-pods/east"
    for hook in (mutating, validating):
        assert hook["sideEffects"] == "None" and hook["admissionReviewVersions"] == ["v1"]
        assert hook["failurePolicy"] == "Fail"
        assert hook["namespaceSelector"] == {"matchExpressions": [{"key": "gpupool.io/team", "operator": "Exists"}]}
        assert base64.b64decode(hook["clientConfig"]["caBundle"]) == (control_plane.dir / "pki" / "ca.crt").read_bytes()
    admission = k8s.AdmissionregistrationV1Api(kube_api)
    for document in documents:
        validate_manifest(document)
    admission.create_mutating_webhook_configuration(documents[0], dry_run="All")
    admission.create_validating_webhook_configuration(documents[1], dry_run="All")

    settings.KUBE_WEBHOOK_TOKEN = "tok"
    out = io.StringIO()
    call_command("kube_webhook_config", "--url", "https://portal.example", "--ca-file",
                 str(control_plane.dir / "pki" / "ca.crt"), "--cluster", "east", "--token-in-path", stdout=out)
    assert "/webhooks/kubernetes/mutate-pods/east/tok\n" in out.getvalue()
    with pytest.raises(CommandError, match="https"):
        call_command("kube_webhook_config", "--url", "http://portal.example/", "--ca-file",
                     str(control_plane.dir / "pki" / "ca.crt"))
