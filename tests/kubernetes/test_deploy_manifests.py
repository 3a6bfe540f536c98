"""deploy/: the manifests render with kustomize, pass the Kubernetes schema, keep every process
replicated behind a disruption budget, reference secrets without holding any, and a real API server
accepts them (server-side dry-run on the tests' control plane)."""
from __future__ import annotations

import subprocess
import warnings
from pathlib import Path

import pytest
import yaml
from kubernetes import client as k8s
from kubernetes.dynamic import DynamicClient

BASE_DIR = Path(__file__).resolve().parents[2]
OVERLAY = BASE_DIR / "deploy" / "overlays" / "production"
# The newest schema kubernetes-validate 1.28.3 bundles; the manifests use current API versions
# (policy/v1 PodDisruptionBudget), which the tests' 1.20 control plane predates for PDBs only.
SCHEMA_VERSION = "1.28.0"
REPLICATED = ("gpupool-web", "gpupool-ws", "gpupool-worker", "gpupool-beat")


@pytest.fixture(scope="module")
def documents() -> list[dict]:
    rendered = subprocess.run(["kubectl", "kustomize", str(OVERLAY)], capture_output=True, text=True, check=True)
    return [doc for doc in yaml.safe_load_all(rendered.stdout) if doc]


def _named(documents, kind: str) -> dict[str, dict]:
    return {doc["metadata"]["name"]: doc for doc in documents if doc["kind"] == kind}


def test_every_manifest_passes_the_kubernetes_schema(documents):
    import kubernetes_validate

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # kubernetes-validate 1.28 uses jsonschema.RefResolver
        for doc in documents:
            kubernetes_validate.validate(doc, SCHEMA_VERSION, strict=True)
    assert {doc["kind"] for doc in documents} >= {
        "Namespace", "ConfigMap", "ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding",
        "Deployment", "Service", "PodDisruptionBudget", "Job", "Ingress"}


def test_every_process_runs_twice_or_more_spread_over_nodes_behind_a_budget(documents):
    deployments = _named(documents, "Deployment")
    budgets = _named(documents, "PodDisruptionBudget")
    assert set(deployments) == set(REPLICATED)
    for name, deployment in deployments.items():
        spec = deployment["spec"]
        assert spec["replicas"] >= 2, name
        assert budgets[name]["spec"]["minAvailable"] == 1
        assert budgets[name]["spec"]["selector"] == spec["selector"]
        pod = spec["template"]["spec"]
        terms = pod["affinity"]["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
        assert terms[0]["podAffinityTerm"]["topologyKey"] == "kubernetes.io/hostname"
        (container,) = pod["containers"]
        assert container["image"] == "registry.example.com/gpupool/portal:2026.11"
        assert container["args"] == [name.removeprefix("gpupool-")]
        assert container["resources"]["requests"]["cpu"] and container["resources"]["limits"]["memory"]
        assert pod["securityContext"]["runAsNonRoot"] is True
        assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert deployments["gpupool-web"]["spec"]["replicas"] == 3  # the overlay's count
    for name in ("gpupool-web", "gpupool-ws"):
        (container,) = deployments[name]["spec"]["template"]["spec"]["containers"]
        assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
        assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"


def test_secrets_are_referenced_never_embedded(documents):
    assert not [doc for doc in documents if doc["kind"] == "Secret"]
    for doc in documents:
        if doc["kind"] in ("Deployment", "Job"):
            (container,) = doc["spec"]["template"]["spec"]["containers"]
            assert {"secretRef": {"name": "gpupool-secrets"}} in container["envFrom"]
            assert "env" not in container
    settings = _named(documents, "ConfigMap")["gpupool-settings"]["data"]
    assert not {"SECRET_KEY", "DATABASE_URL", "REDIS_URL", "EMAIL_URL", "FIELD_ENCRYPTION_KEY"} & set(settings)
    assert settings["ALLOWED_HOSTS"] == "gpu.corp.example"


def test_one_address_sends_websockets_to_ws_and_the_rest_to_web(documents):
    (rule,) = _named(documents, "Ingress")["gpupool"]["spec"]["rules"]
    routes = {path["path"]: path["backend"]["service"]["name"] for path in rule["http"]["paths"]}
    assert routes == {"/ws/": "gpupool-ws", "/": "gpupool-web"}


def test_the_backend_account_gets_only_what_the_backend_does(documents):
    rules = _named(documents, "ClusterRole")["gpupool-portal"]["rules"]
    granted = {(resource, verb) for rule in rules for resource in rule["resources"] for verb in rule["verbs"]}
    assert ("secrets", "get") not in granted and not any(verb in ("delete", "*") for _, verb in granted)
    assert ("resourcequotas", "patch") in granted and ("nodes", "patch") in granted
    role = _named(documents, "Role")["gpupool-portal"]
    assert role["metadata"]["namespace"] == "gpupool-system"
    assert role["rules"] == [{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get", "create", "patch"]}]


def test_the_api_server_accepts_every_manifest_in_a_server_side_dry_run(documents, kube_api):
    core = k8s.CoreV1Api(kube_api)
    dynamic = DynamicClient(kube_api)
    # Namespaced objects are checked against their namespace, so those two are made for real.
    for namespace in _named(documents, "Namespace"):
        if namespace not in {item.metadata.name for item in core.list_namespace().items}:
            core.create_namespace({"metadata": {"name": namespace}})
    accepted = []
    for doc in documents:
        body = dict(doc)
        if doc["kind"] == "PodDisruptionBudget":
            body["apiVersion"] = "policy/v1beta1"  # 1.20 serves PDBs only there; the spec is the same
        resource = dynamic.resources.get(api_version=body["apiVersion"], kind=body["kind"])
        namespace = body["metadata"].get("namespace")
        if body["kind"] == "Namespace":
            resource.patch(body=body, name=body["metadata"]["name"], dry_run="All", field_manager="deploy-test",
                           content_type="application/apply-patch+yaml", force=True)
        else:
            resource.create(body=body, namespace=namespace, dry_run="All")
        accepted.append(f"{doc['kind']}/{doc['metadata']['name']}")
    assert len(accepted) == len(documents)


def test_the_dry_run_does_refuse_a_broken_manifest(documents, kube_api):
    """The check above is not a no-op: the same call refuses what the API server would refuse."""
    import copy

    from kubernetes.client.exceptions import ApiException

    web = copy.deepcopy(_named(documents, "Deployment")["gpupool-web"])
    web["spec"]["template"]["spec"]["containers"][0]["name"] = "Not_A_DNS_Label"
    resource = DynamicClient(kube_api).resources.get(api_version="apps/v1", kind="Deployment")
    with pytest.raises(ApiException) as refused:
        resource.create(body=web, namespace="gpupool", dry_run="All")
    assert refused.value.status == 422
