"""Install the admission webhooks on a registered Kubernetes cluster, through its stored kubeconfig.

    python manage.py kube_webhook_install --cluster gpu-east --url https://portal.example/ \
        (--make-certificate /etc/gpupool/webhook-tls | --ca-file ca.crt | --cert-manager gpupool/webhook-tls)

--make-certificate keeps the portal's own CA and serving certificate in that folder (renewed from the same
CA when under 30 days are left: run it again, e.g. monthly, then restart web); serve the portal with
WEB_TLS_CERT and WEB_TLS_KEY from it. Running the command again is safe: it applies the same objects.
"""
from __future__ import annotations

from django.core.management.base import BaseCommand, CommandError

from allocations.management.webhook_options import add_options, configurations
from allocations.webhook_setup import install
from inventory.kubernetes.client import ClusterError
from inventory.models import Cluster


class Command(BaseCommand):
    help = "Apply the admission webhook configurations to a registered Kubernetes cluster."

    def add_arguments(self, parser) -> None:
        add_options(parser, install=True)

    def handle(self, *args, **options) -> None:
        try:
            cluster = Cluster.objects.get(slug=options["cluster"], kind=Cluster.Kind.KUBERNETES)
        except Cluster.DoesNotExist:
            raise CommandError(f"--cluster: no Kubernetes cluster {options['cluster']!r} is registered") from None
        documents, managed = configurations(options)
        try:
            applied = install(cluster, documents)
        except ClusterError as error:
            raise CommandError(f"cluster {cluster.slug}: {error.message}") from error
        for name in applied:
            self.stdout.write(f"applied {name} on {cluster.slug}")
        if managed is not None:
            what = "made" if managed.renewed else "kept (still valid)"
            self.stdout.write(f"serving certificate {what}: WEB_TLS_CERT={managed.cert} WEB_TLS_KEY={managed.key}")
