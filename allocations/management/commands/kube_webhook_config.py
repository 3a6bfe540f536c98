"""Print the MutatingWebhookConfiguration and ValidatingWebhookConfiguration that point a cluster at the portal.

    python manage.py kube_webhook_config --url https://portal.example/ --ca-file ca.crt \
        [--cluster gpu-east] [--token-in-path] [--failure-policy Fail] | kubectl apply -f -

Only pods in namespaces that carry the portal's team label are sent (namespaceSelector),
only on CREATE, with sideEffects None and admissionReviewVersions [v1]. ``--cluster``
puts the cluster's slug in the URL so the portal counts only that cluster's grants.
``--token-in-path`` puts KUBE_WEBHOOK_TOKEN in the URL (for API servers whose admission
configuration cannot send a bearer token); otherwise configure the API server's
AdmissionConfiguration with that token, or protect the route at the ingress.
"""
from __future__ import annotations

import base64
from pathlib import Path

import yaml
from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from allocations.apply.desired import MANAGED_BY_LABEL, MANAGED_BY_VALUE, TEAM_LABEL

NAME = "gpupool-portal"


def webhook_configurations(*, url: str, ca_bundle: bytes, cluster: str = "", token: str = "",
                           failure_policy: str = "Fail", timeout_seconds: int = 5) -> list[dict]:
    base = url.rstrip("/") + "/webhooks/kubernetes"

    def hook_url(kind: str) -> str:
        parts = [base, f"{kind}-pods"]
        if cluster:
            parts.append(cluster)
            if token:
                parts.append(token)
        return "/".join(parts)  # no trailing slash: the API server would drop it anyway

    common = {
        "clientConfig": {"url": "", "caBundle": base64.b64encode(ca_bundle).decode()},
        "rules": [{"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"], "resources": ["pods"],
                   "scope": "Namespaced"}],
        "namespaceSelector": {"matchExpressions": [{"key": TEAM_LABEL, "operator": "Exists"}]},
        "failurePolicy": failure_policy,
        "sideEffects": "None",
        "admissionReviewVersions": ["v1"],
        "timeoutSeconds": timeout_seconds,
    }
    labels = {MANAGED_BY_LABEL: MANAGED_BY_VALUE}
    mutating = {**common, "name": "pin-pods.gpupool.io", "reinvocationPolicy": "IfNeeded",
                "clientConfig": {**common["clientConfig"], "url": hook_url("mutate")}}
    validating = {**common, "name": "gpu-requests.gpupool.io",
                  "clientConfig": {**common["clientConfig"], "url": hook_url("validate")}}
    return [
        {"apiVersion": "admissionregistration.k8s.io/v1", "kind": "MutatingWebhookConfiguration",
         "metadata": {"name": NAME, "labels": labels}, "webhooks": [mutating]},
        {"apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingWebhookConfiguration",
         "metadata": {"name": NAME, "labels": labels}, "webhooks": [validating]},
    ]


class Command(BaseCommand):
    help = "Print the admission webhook configurations (YAML) that make a cluster ask the portal about team pods."

    def add_arguments(self, parser) -> None:
        parser.add_argument("--url", required=True, help="The portal's HTTPS base URL, e.g. https://portal.example/")
        parser.add_argument("--ca-file", required=True, help="PEM CA bundle the API server uses to trust the portal")
        parser.add_argument("--cluster", default="", help="Cluster slug to put in the URL (recommended)")
        parser.add_argument("--token-in-path", action="store_true",
                            help="Put KUBE_WEBHOOK_TOKEN in the URL (needs --cluster)")
        parser.add_argument("--failure-policy", choices=["Fail", "Ignore"], default="Fail",
                            help="Fail (default): team pods are refused while the portal is unreachable")
        parser.add_argument("--timeout", type=int, default=5, help="Webhook timeout in seconds (1-30)")

    def handle(self, *args, **options) -> None:
        url = options["url"]
        if not url.startswith("https://"):
            raise CommandError("--url must be https:// (the API server only calls webhooks over TLS)")
        try:
            ca = Path(options["ca_file"]).read_bytes()
        except OSError as exc:
            raise CommandError(f"--ca-file: {exc}") from exc
        if b"-----BEGIN CERTIFICATE-----" not in ca:
            raise CommandError("--ca-file must hold PEM certificates")
        token = ""
        if options["token_in_path"]:
            if not options["cluster"]:
                raise CommandError("--token-in-path needs --cluster")
            token = settings.KUBE_WEBHOOK_TOKEN
            if not token:
                raise CommandError("--token-in-path needs KUBE_WEBHOOK_TOKEN to be set")
        if not 1 <= options["timeout"] <= 30:
            raise CommandError("--timeout must be from 1 to 30")
        documents = webhook_configurations(url=url, ca_bundle=ca, cluster=options["cluster"], token=token,
                                           failure_policy=options["failure_policy"],
                                           timeout_seconds=options["timeout"])
        self.stdout.write(yaml.safe_dump_all(documents, sort_keys=False), ending="")
