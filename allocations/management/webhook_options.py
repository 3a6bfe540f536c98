"""The options the two webhook commands share (kube_webhook_config prints, kube_webhook_install applies),
checked once."""
from __future__ import annotations

from pathlib import Path
from urllib.parse import urlsplit

from django.conf import settings
from django.core.management.base import CommandError

from allocations.webhook_setup import ManagedCertificate, managed_certificate, webhook_configurations


def add_options(parser, *, install: bool) -> None:
    parser.add_argument("--url", required=True, help="The portal's HTTPS base URL, e.g. https://portal.example/")
    trust = parser.add_mutually_exclusive_group(required=True)
    trust.add_argument("--ca-file", help="PEM CA bundle the API server uses to trust the portal")
    if install:
        trust.add_argument("--make-certificate", metavar="DIR",
                           help="Make (or renew) the portal's own CA and serving certificate for the URL's host in "
                                "DIR; serve with WEB_TLS_CERT=DIR/tls.crt WEB_TLS_KEY=DIR/tls.key")
        trust.add_argument("--cert-manager", metavar="NAMESPACE/CERTIFICATE",
                           help="Let cert-manager's CA injector fill the caBundle from this Certificate")
        parser.add_argument("--host", action="append", default=[],
                            help="More names or addresses for --make-certificate (repeatable)")
    parser.add_argument("--cluster", default="", required=install,
                        help="Cluster slug to put in the URL" + (" and to install on" if install else " (recommended)"))
    parser.add_argument("--token-in-path", action="store_true",
                        help="Put KUBE_WEBHOOK_TOKEN in the URL (needs --cluster)")
    parser.add_argument("--failure-policy", choices=["Fail", "Ignore"], default="Fail",
                        help="Fail (default): team pods are refused while the portal is unreachable")
    parser.add_argument("--timeout", type=int, default=5, help="Webhook timeout in seconds (1-30)")


def configurations(options: dict) -> tuple[list[dict], ManagedCertificate | None]:
    """The configurations the options ask for, and the managed certificate when one was made or kept."""
    url = options["url"]
    if not url.startswith("https://"):
        raise CommandError("--url must be https:// (the API server only calls webhooks over TLS)")
    managed, ca, cert_manager = None, b"", options.get("cert_manager") or ""
    if options.get("ca_file"):
        try:
            ca = Path(options["ca_file"]).read_bytes()
        except OSError as exc:
            raise CommandError(f"--ca-file: {exc}") from exc
        if b"-----BEGIN CERTIFICATE-----" not in ca:
            raise CommandError("--ca-file must hold PEM certificates")
    elif options.get("make_certificate"):
        hosts = [urlsplit(url).hostname or "", *options.get("host", [])]
        managed = managed_certificate(Path(options["make_certificate"]), [h for h in hosts if h])
        ca = managed.ca.read_bytes()
    elif cert_manager.count("/") != 1 or not all(cert_manager.split("/")):
        raise CommandError("--cert-manager must be NAMESPACE/CERTIFICATE")
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
                                       timeout_seconds=options["timeout"], cert_manager=cert_manager)
    return documents, managed
