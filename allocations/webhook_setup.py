"""The admission webhooks on a cluster: their configurations, the certificate the portal serves them with,
and installing them through the cluster's own API (server-side apply, as the backend applies quotas).

The API server calls a webhook only over TLS and only trusts the CA named in the configuration's
`caBundle`. Three ways to get one:
  - a CA of your own (`ca_bundle`): the certificate the portal serves (WEB_TLS_CERT) is signed by it;
  - one the portal makes and keeps (`managed_certificate`): a CA that lives ten years and a serving
    certificate signed by it, renewed from the same CA when it has under RENEW_DAYS left, so the
    installed caBundle stays valid across renewals;
  - cert-manager (`cert_manager="namespace/certificate"`): the configurations carry its
    `cert-manager.io/inject-ca-from` annotation and no caBundle; its CA injector fills it in.
"""
from __future__ import annotations

import base64
import datetime as dt
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
from kubernetes import client as k8s

from allocations.apply.backends.kubernetes import APPLY_PATCH
from allocations.apply.desired import FIELD_MANAGER, MANAGED_BY_LABEL, MANAGED_BY_VALUE, TEAM_LABEL
from inventory.kubernetes.client import call, connect

NAME = "gpupool-portal"
CA_DAYS = 3650
SERVING_DAYS = 365
RENEW_DAYS = 30  # a serving certificate with less left than this is made anew (from the same CA)
CERT_MANAGER_ANNOTATION = "cert-manager.io/inject-ca-from"


def webhook_configurations(*, url: str, ca_bundle: bytes = b"", cluster: str = "", token: str = "",
                           failure_policy: str = "Fail", timeout_seconds: int = 5,
                           cert_manager: str = "") -> list[dict]:
    """The MutatingWebhookConfiguration (pins team pods to their granted GPUs) and the
    ValidatingWebhookConfiguration (refuses pods asking more than the team holds) for a portal at `url`.

    Only pods in namespaces that carry the portal's team label are sent, only on CREATE, with
    sideEffects None and admissionReviewVersions [v1]. `cluster` puts the cluster's slug in the URL so
    the portal counts only that cluster's grants; `token` (with `cluster`) puts KUBE_WEBHOOK_TOKEN in it
    for API servers that cannot send a bearer token."""
    base = url.rstrip("/") + "/webhooks/kubernetes"

    def hook_url(kind: str) -> str:
        parts = [base, f"{kind}-pods"]
        if cluster:
            parts.append(cluster)
            if token:
                parts.append(token)
        return "/".join(parts)  # no trailing slash: the API server would drop it anyway

    client_config = {"caBundle": base64.b64encode(ca_bundle).decode()} if not cert_manager else {}
    common = {
        "rules": [{"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"], "resources": ["pods"],
                   "scope": "Namespaced"}],
        "namespaceSelector": {"matchExpressions": [{"key": TEAM_LABEL, "operator": "Exists"}]},
        "failurePolicy": failure_policy,
        "sideEffects": "None",
        "admissionReviewVersions": ["v1"],
        "timeoutSeconds": timeout_seconds,
    }
    metadata = {"name": NAME, "labels": {MANAGED_BY_LABEL: MANAGED_BY_VALUE}}
    if cert_manager:
        metadata["annotations"] = {CERT_MANAGER_ANNOTATION: cert_manager}
    mutating = {**common, "name": "pin-pods.gpupool.io", "reinvocationPolicy": "IfNeeded",
                "clientConfig": {**client_config, "url": hook_url("mutate")}}
    validating = {**common, "name": "gpu-requests.gpupool.io",
                  "clientConfig": {**client_config, "url": hook_url("validate")}}
    return [
        {"apiVersion": "admissionregistration.k8s.io/v1", "kind": "MutatingWebhookConfiguration",
         "metadata": dict(metadata), "webhooks": [mutating]},
        {"apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingWebhookConfiguration",
         "metadata": dict(metadata), "webhooks": [validating]},
    ]


def install(cluster, documents: list[dict]) -> list[str]:
    """Apply the configurations to `cluster` (its stored kubeconfig) with server-side apply; the portal owns
    the fields it sends and nothing else (cert-manager's injected caBundle stays cert-manager's).
    Returns what was applied, as "Kind/name"."""
    applied = []
    with connect(cluster) as api:
        admission = k8s.AdmissionregistrationV1Api(api)
        patch = {"MutatingWebhookConfiguration": admission.patch_mutating_webhook_configuration,
                 "ValidatingWebhookConfiguration": admission.patch_validating_webhook_configuration}
        for document in documents:
            call(patch[document["kind"]], document["metadata"]["name"], document, field_manager=FIELD_MANAGER,
                 force=True, _content_type=APPLY_PATCH, _preload_content=False)
            applied.append(f"{document['kind']}/{document['metadata']['name']}")
    return applied


@dataclass(frozen=True)
class ManagedCertificate:
    ca: Path    # ca.crt: what the configurations' caBundle holds
    cert: Path  # tls.crt: serve with WEB_TLS_CERT
    key: Path   # tls.key, PKCS#8: WEB_TLS_KEY
    renewed: bool


def managed_certificate(directory: Path, hosts: list[str], *, now: dt.datetime | None = None) -> ManagedCertificate:
    """The portal's own CA and serving certificate for `hosts` (names or IP addresses) in `directory`:
    made when missing, the serving one made anew from the same CA when it expires within RENEW_DAYS or
    does not cover `hosts`. Keys are written readable by their owner only."""
    now = now or dt.datetime.now(dt.UTC)
    directory.mkdir(parents=True, exist_ok=True)
    ca_cert_path, ca_key_path = directory / "ca.crt", directory / "ca.key"
    cert_path, key_path = directory / "tls.crt", directory / "tls.key"
    if ca_cert_path.exists() and ca_key_path.exists():
        ca_cert = x509.load_pem_x509_certificate(ca_cert_path.read_bytes())
        ca_key = serialization.load_pem_private_key(ca_key_path.read_bytes(), password=None)
    else:
        ca_key = ec.generate_private_key(ec.SECP256R1())
        name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "gpupool-portal webhook CA")])
        ca_cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name)
                   .public_key(ca_key.public_key()).serial_number(x509.random_serial_number())
                   .not_valid_before(now - dt.timedelta(minutes=5)).not_valid_after(now + dt.timedelta(days=CA_DAYS))
                   .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
                   .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                                content_commitment=False, key_encipherment=False,
                                                data_encipherment=False, key_agreement=False,
                                                encipher_only=False, decipher_only=False), critical=True)
                   .sign(ca_key, hashes.SHA256()))
        _write(ca_key_path, _pkcs8(ca_key), private=True)
        _write(ca_cert_path, ca_cert.public_bytes(serialization.Encoding.PEM))
    names = [x509.IPAddress(ipaddress.ip_address(h)) if _is_ip(h) else x509.DNSName(h) for h in hosts]
    if cert_path.exists() and key_path.exists() and not _due(cert_path, names, ca_cert, now):
        return ManagedCertificate(ca_cert_path, cert_path, key_path, renewed=False)
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, hosts[0])]))
            .issuer_name(ca_cert.subject).public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=5)).not_valid_after(now + dt.timedelta(days=SERVING_DAYS))
            .add_extension(x509.SubjectAlternativeName(names), critical=False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
            .sign(ca_key, hashes.SHA256()))
    _write(key_path, _pkcs8(key), private=True)
    _write(cert_path, cert.public_bytes(serialization.Encoding.PEM))
    return ManagedCertificate(ca_cert_path, cert_path, key_path, renewed=True)


def _due(cert_path: Path, names: list, ca_cert: x509.Certificate, now: dt.datetime) -> bool:
    cert = x509.load_pem_x509_certificate(cert_path.read_bytes())
    try:
        covered = set(cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value)
    except x509.ExtensionNotFound:
        covered = set()
    return (cert.not_valid_after_utc - now < dt.timedelta(days=RENEW_DAYS) or not set(names) <= covered
            or cert.issuer != ca_cert.subject)


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


def _pkcs8(key) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def _write(path: Path, data: bytes, *, private: bool = False) -> None:
    path.touch(mode=0o600 if private else 0o644, exist_ok=True)
    if private:
        path.chmod(0o600)
    path.write_bytes(data)
