"""End to end: kube-apiserver itself calls the portal's webhooks over TLS when a team pod is created.

The portal runs as its real web server process (`python -m config.web`) over HTTPS (a certificate for 127.0.0.1 signed by
the control plane's CA) on this test's PostgreSQL database; the webhook configurations come
from ``kube_webhook_config``, narrowed to this test's namespace so nothing else in the
session is affected, and are deleted at the end.
"""
from __future__ import annotations

import io
import json
import subprocess
import sys
import time

import pytest
import yaml
from django.core.management import call_command
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from allocations.apply.backends.kubernetes import KubernetesBackend
from allocations.apply.selectors import cluster_desired
from tests.conftest import free_port, listening, start_server, stop_process_group
from tests.kubernetes.conftest import active_reservation, unique
from tests.kubernetes.sharing import active, mig_team, shared_pool, vgpu_row


@pytest.fixture
def https_portal(worker_env, control_plane, tmp_path):
    """The web server serving the portal over HTTPS on 127.0.0.1, trusted through the control plane's CA."""
    pki = control_plane.dir / "pki"
    key, csr, cert, ext = (tmp_path / n for n in ("portal.key", "portal.csr", "portal.crt", "san.ext"))
    ext.write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
    subprocess.run(["openssl", "req", "-newkey", "rsa:2048", "-nodes", "-keyout", key, "-out", csr,
                    "-subj", "/CN=gpupool-portal"], check=True, capture_output=True)
    subprocess.run(["openssl", "x509", "-req", "-in", csr, "-CA", pki / "ca.crt", "-CAkey", pki / "ca.key",
                    "-CAcreateserial", "-out", cert, "-days", "1", "-extfile", ext], check=True, capture_output=True)
    port = free_port()


    process = start_server(
        [sys.executable, "-m", "config.web", "--workers", "1", "--port", str(port),
         "--ssl-certificate", str(cert), "--ssl-keyfile", str(key), "--access-log"],
        env=worker_env, log_path=tmp_path / "web.log", what="the portal over HTTPS", ready=listening(port),
    )
    yield f"https://127.0.0.1:{port}/"
    stop_process_group(process)


def register_webhooks(admission, https_portal: str, control_plane, cluster, team_slug: str) -> str:
    """The portal's webhook configurations from ``kube_webhook_config``, narrowed to one team's namespace."""
    out = io.StringIO()
    call_command("kube_webhook_config", "--url", https_portal, "--ca-file", str(control_plane.dir / "pki" / "ca.crt"),
                 "--cluster", cluster.slug, stdout=out)
    name = unique("gpupool-e2e")
    documents = list(yaml.safe_load_all(out.getvalue()))
    for document in documents:
        document["metadata"]["name"] = name
        # Only this test's namespace: the rest of the session must not depend on this portal process.
        document["webhooks"][0]["namespaceSelector"] = {"matchLabels": {"gpupool.io/team": team_slug}}
    admission.create_mutating_webhook_configuration(documents[0])
    admission.create_validating_webhook_configuration(documents[1])
    return name


def create_when_called(core, namespace: str, pod: dict, called) -> k8s.V1Pod:
    """Create `pod` (dry run) until the API server has picked up the new webhook configurations (`called`)."""
    deadline = time.monotonic() + 30
    while True:
        try:
            created = core.create_namespaced_pod(namespace, pod, dry_run="All")
        except ApiException as exc:  # e.g. the first call timing out on a busy machine
            if time.monotonic() > deadline:
                raise
            print("retrying after", exc.status, exc.body[:300])
            created = None
        if (created is not None and called(created)) or time.monotonic() > deadline:
            return created
        time.sleep(0.5)


def test_the_api_server_calls_the_portal_to_pin_and_to_refuse_pods(https_portal, control_plane, kube_api,
                                                                     kube_cluster):
    core = k8s.CoreV1Api(kube_api)
    admission = k8s.AdmissionregistrationV1Api(kube_api)
    team, reservation, namespace = active_reservation(kube_cluster, "e2e")
    KubernetesBackend(kube_cluster).sync(cluster_desired(kube_cluster), teams=[team.slug])

    name = register_webhooks(admission, https_portal, control_plane, kube_cluster, team.slug)
    try:
        def pod(gpus: int) -> dict:
            return {"apiVersion": "v1", "kind": "Pod", "metadata": {"generateName": "train-"},
                    "spec": {"automountServiceAccountToken": False, "containers": [
                        {"name": "main", "image": "busybox",
                         "resources": {"limits": {"nvidia.com/gpu": str(gpus)}}}]}}

        # The API server picks up new webhook configurations within a moment; retry until it calls us.
        created = create_when_called(core, namespace, pod(1), lambda p: p.spec.affinity is not None)
        terms = created.spec.affinity.node_affinity.required_during_scheduling_ignored_during_execution \
            .node_selector_terms
        assert terms[0].match_expressions[0].key == "kubernetes.io/hostname"
        assert terms[0].match_expressions[0].values == [reservation.allocations.first().gpu.node.name]
        assert created.metadata.annotations["gpupool.io/reservations"] == str(reservation.pk)

        with pytest.raises(ApiException) as refused:
            core.create_namespaced_pod(namespace, pod(3), dry_run="All")
        message = json.loads(refused.value.body)["message"]
        assert refused.value.status == 403
        assert message.startswith('admission webhook "gpu-requests.gpupool.io" denied the request')
        assert f"team {team.slug} holds 2 nvidia.com/gpu" in message and "asks for 3" in message
    finally:
        admission.delete_mutating_webhook_configuration(name)
        admission.delete_validating_webhook_configuration(name)


def test_a_hami_pod_is_pinned_to_its_gpu_uuid_and_an_over_asking_mig_pod_refused(https_portal, control_plane,
                                                                                   kube_api, kube_cluster):
    """One team holding two MIG instances and a vGPU of one GPU; the API server calls the portal for each pod."""
    core = k8s.CoreV1Api(kube_api)
    admission = k8s.AdmissionregistrationV1Api(kube_api)
    team, _, mig_node, _ = mig_team(kube_cluster, "e2e-mig")
    pool, node = shared_pool(kube_cluster, "e2e-hami", "vgpu", {})
    gpu = node.gpus.get(index=1)
    vgpu_row(active(team, pool, mode="vgpu", gpus=1, gpu_memory_mib=20000, gpu_cores_pct=30, ge=0.3), gpu,
             memory_mib=20000, cores_pct=30)
    namespace = f"gpupool-{team.slug}"
    KubernetesBackend(kube_cluster).sync(cluster_desired(kube_cluster), teams=[team.slug])
    name = register_webhooks(admission, https_portal, control_plane, kube_cluster, team.slug)
    try:
        def pod(**limits) -> dict:
            return {"apiVersion": "v1", "kind": "Pod", "metadata": {"generateName": "vgpu-"},
                    "spec": {"automountServiceAccountToken": False, "containers": [
                        {"name": "main", "image": "busybox",
                         "resources": {"limits": {k: str(v) for k, v in limits.items()}}}]}}

        hami = pod(**{"nvidia.com/gpu": 1, "nvidia.com/gpumem": 20000, "nvidia.com/gpucores": 30})
        created = create_when_called(core, namespace, hami, lambda p: p.spec.affinity is not None)
        assert created.metadata.annotations["nvidia.com/use-gpuuuid"] == gpu.uuid
        terms = created.spec.affinity.node_affinity.required_during_scheduling_ignored_during_execution \
            .node_selector_terms
        assert terms[0].match_expressions[0].values == [node.name]

        mig = core.create_namespaced_pod(namespace, pod(**{"nvidia.com/mig-3g.40gb": 2}), dry_run="All")
        assert "nvidia.com/use-gpuuuid" not in (mig.metadata.annotations or {})
        assert mig.spec.affinity.node_affinity.required_during_scheduling_ignored_during_execution \
            .node_selector_terms[0].match_expressions[0].values == [mig_node.name]

        for limits, words in (({"nvidia.com/mig-3g.40gb": 3},
                               f"pod asks for 3 nvidia.com/mig-3g.40gb; team {team.slug} holds 2"),
                              ({"nvidia.com/gpu": 1, "nvidia.com/gpumem": 30000},
                               f"pod asks for 30000 nvidia.com/gpumem; team {team.slug} holds 20000")):
            with pytest.raises(ApiException) as refused:
                core.create_namespaced_pod(namespace, pod(**limits), dry_run="All")
            message = json.loads(refused.value.body)["message"]
            assert refused.value.status == 403
            assert message.startswith('admission webhook "gpu-requests.gpupool.io" denied the request'), message
            assert words in message
    finally:
        admission.delete_mutating_webhook_configuration(name)
        admission.delete_validating_webhook_configuration(name)
