"""The portal installs its admission webhooks itself (`kube_webhook_install`), with a certificate it makes and
keeps, or one from cert-manager; the real API server then calls it over TLS trusting that certificate."""
from __future__ import annotations

import base64
import datetime as dt
import io
import stat
import sys

import pytest
from cryptography import x509
from django.core.management import call_command
from django.core.management.base import CommandError
from kubernetes import client as k8s

from allocations.apply.backends.kubernetes import KubernetesBackend
from allocations.apply.selectors import cluster_desired
from allocations.webhook_setup import CERT_MANAGER_ANNOTATION, NAME, managed_certificate
from tests.conftest import free_port, listening, start_server, stop_process_group
from tests.kubernetes.conftest import active_reservation
from tests.kubernetes.test_webhook_e2e import create_when_called


def _cert(path) -> x509.Certificate:
    return x509.load_pem_x509_certificate(path.read_bytes())


def test_the_managed_certificate_is_made_kept_and_renewed_from_the_same_ca(tmp_path):
    made = managed_certificate(tmp_path, ["portal.example", "10.0.0.7"])
    assert made.renewed
    ca, serving = _cert(made.ca), _cert(made.cert)
    serving.verify_directly_issued_by(ca)
    names = serving.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert names.get_values_for_type(x509.DNSName) == ["portal.example"]
    assert [str(ip) for ip in names.get_values_for_type(x509.IPAddress)] == ["10.0.0.7"]
    assert stat.S_IMODE(made.key.stat().st_mode) == 0o600
    assert made.key.read_bytes().startswith(b"-----BEGIN PRIVATE KEY-----")  # PKCS#8, as WEB_TLS_KEY wants

    kept = managed_certificate(tmp_path, ["portal.example"])
    assert not kept.renewed and _cert(kept.cert).serial_number == serving.serial_number
    # Under 30 days left: a new serving certificate from the same CA (the installed caBundle stays good).
    later = dt.datetime.now(dt.UTC) + dt.timedelta(days=340)
    renewed = managed_certificate(tmp_path, ["portal.example"], now=later)
    assert renewed.renewed and _cert(renewed.cert).serial_number != serving.serial_number
    _cert(renewed.cert).verify_directly_issued_by(_cert(renewed.ca))
    assert _cert(renewed.ca).serial_number == ca.serial_number
    # A host the certificate does not name: made anew too.
    assert managed_certificate(tmp_path, ["portal.example", "portal.internal"]).renewed


def test_the_command_refuses_what_it_cannot_install(kube_cluster, tmp_path):
    with pytest.raises(CommandError, match="https://"):
        call_command("kube_webhook_install", "--cluster", kube_cluster.slug, "--url", "http://portal/",
                     "--make-certificate", str(tmp_path))
    with pytest.raises(CommandError, match="no Kubernetes cluster 'nowhere'"):
        call_command("kube_webhook_install", "--cluster", "nowhere", "--url", "https://portal/",
                     "--make-certificate", str(tmp_path))
    with pytest.raises(CommandError, match="NAMESPACE/CERTIFICATE"):
        call_command("kube_webhook_install", "--cluster", kube_cluster.slug, "--url", "https://portal/",
                     "--cert-manager", "just-a-name")


@pytest.fixture
def admission(kube_api):
    api = k8s.AdmissionregistrationV1Api(kube_api)
    yield api
    for delete in (api.delete_mutating_webhook_configuration, api.delete_validating_webhook_configuration):
        try:
            delete(NAME)
        except k8s.exceptions.ApiException:
            pass


def test_installed_with_its_own_certificate_the_api_server_calls_the_portal(worker_env, kube_cluster, kube_api,
                                                                             admission, tmp_path):
    core = k8s.CoreV1Api(kube_api)
    team, reservation, namespace = active_reservation(kube_cluster, "install")
    KubernetesBackend(kube_cluster).sync(cluster_desired(kube_cluster), teams=[team.slug])
    port = free_port()
    url = f"https://127.0.0.1:{port}/"
    out = io.StringIO()
    call_command("kube_webhook_install", "--cluster", kube_cluster.slug, "--url", url,
                 "--make-certificate", str(tmp_path / "tls"), stdout=out)
    assert f"applied MutatingWebhookConfiguration/{NAME} on {kube_cluster.slug}" in out.getvalue()
    assert "serving certificate made" in out.getvalue()
    installed = admission.read_mutating_webhook_configuration(NAME)
    assert base64.b64decode(installed.webhooks[0].client_config.ca_bundle) == (tmp_path / "tls" / "ca.crt").read_bytes()
    assert installed.webhooks[0].client_config.url == f"{url}webhooks/kubernetes/mutate-pods/{kube_cluster.slug}"


    env = {**worker_env, "WEB_TLS_CERT": str(tmp_path / "tls" / "tls.crt"),
           "WEB_TLS_KEY": str(tmp_path / "tls" / "tls.key")}
    web = start_server([sys.executable, "-m", "config.web", "--workers", "1", "--port", str(port)], env=env,
                       log_path=tmp_path / "web.log", what="the portal over HTTPS", ready=listening(port))
    try:
        pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"generateName": "train-"},
               "spec": {"automountServiceAccountToken": False, "containers": [
                   {"name": "main", "image": "busybox", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}}
        created = create_when_called(core, namespace, pod, lambda p: p.spec.affinity is not None)
        assert created is not None and created.spec.affinity is not None, (tmp_path / "web.log").read_text()[-2000:]
        assert created.metadata.annotations["gpupool.io/reservations"] == str(reservation.pk)
    finally:
        stop_process_group(web)

    # Again: the same objects, the certificate kept.
    again = io.StringIO()
    call_command("kube_webhook_install", "--cluster", kube_cluster.slug, "--url", url,
                 "--make-certificate", str(tmp_path / "tls"), stdout=again)
    assert "serving certificate kept (still valid)" in again.getvalue()
    assert admission.read_mutating_webhook_configuration(NAME).webhooks[0].client_config.ca_bundle == \
        installed.webhooks[0].client_config.ca_bundle


def test_with_cert_manager_the_configurations_ask_its_injector_for_the_ca(kube_cluster, admission):
    call_command("kube_webhook_install", "--cluster", kube_cluster.slug, "--url", "https://gpupool.example/",
                 "--cert-manager", "gpupool/webhook-tls", stdout=io.StringIO())
    for read in (admission.read_mutating_webhook_configuration, admission.read_validating_webhook_configuration):
        installed = read(NAME)
        assert installed.metadata.annotations[CERT_MANAGER_ANNOTATION] == "gpupool/webhook-tls"
        assert not installed.webhooks[0].client_config.ca_bundle  # cert-manager's to fill, not ours
