"""End to end: kube-apiserver itself calls the portal's webhooks over TLS when a team pod is created.

The portal runs as its real web server process (`python -m config.web`) over HTTPS (a certificate for 127.0.0.1 signed by
the control plane's CA) on this test's PostgreSQL database; the webhook configurations come
from ``kube_webhook_config``, narrowed to this test's namespace so nothing else in the
session is affected, and are deleted at the end.
"""
from __future__ import annotations

import io
import json
import socket
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
from tests.conftest import free_port, start_server, stop_process_group
from tests.kubernetes.conftest import active_reservation, unique


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

    def listening() -> bool:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return True
        except OSError:
            return False

    process = start_server(
        [sys.executable, "-m", "config.web", "--workers", "1", "--port", str(port),
         "--ssl-certificate", str(cert), "--ssl-keyfile", str(key), "--access-log"],
        env=worker_env, log_path=tmp_path / "web.log", what="the portal over HTTPS", ready=listening,
    )
    yield f"https://127.0.0.1:{port}/"
    stop_process_group(process)


def test_the_api_server_calls_the_portal_to_pin_and_to_refuse_pods(https_portal, control_plane, kube_api,
                                                                     kube_cluster):
    core = k8s.CoreV1Api(kube_api)
    admission = k8s.AdmissionregistrationV1Api(kube_api)
    team, reservation, namespace = active_reservation(kube_cluster, "e2e")
    KubernetesBackend(kube_cluster).sync(cluster_desired(kube_cluster), teams=[team.slug])

    out = io.StringIO()
    call_command("kube_webhook_config", "--url", https_portal, "--ca-file", str(control_plane.dir / "pki" / "ca.crt"),
                 "--cluster", kube_cluster.slug, stdout=out)
    documents = list(yaml.safe_load_all(out.getvalue()))
    name = unique("gpupool-e2e")
    for document in documents:
        document["metadata"]["name"] = name
        # Only this test's namespace: the rest of the session must not depend on this portal process.
        document["webhooks"][0]["namespaceSelector"] = {"matchLabels": {"gpupool.io/team": team.slug}}
    admission.create_mutating_webhook_configuration(documents[0])
    admission.create_validating_webhook_configuration(documents[1])
    try:
        def pod(gpus: int) -> dict:
            return {"apiVersion": "v1", "kind": "Pod", "metadata": {"generateName": "train-"},
                    "spec": {"automountServiceAccountToken": False, "containers": [
                        {"name": "main", "image": "busybox",
                         "resources": {"limits": {"nvidia.com/gpu": str(gpus)}}}]}}

        # The API server picks up new webhook configurations within a moment; retry until it calls us.
        deadline = time.monotonic() + 30
        while True:
            try:
                created = core.create_namespaced_pod(namespace, pod(1), dry_run="All")
            except ApiException as exc:  # e.g. the first call timing out on a busy machine
                if time.monotonic() > deadline:
                    raise
                print("retrying after", exc.status, exc.body[:300])
                created = None
            if (created is not None and created.spec.affinity is not None) or time.monotonic() > deadline:
                break
            time.sleep(0.5)
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
