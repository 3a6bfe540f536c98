"""Print the MutatingWebhookConfiguration and ValidatingWebhookConfiguration that point a cluster at the portal.

    python manage.py kube_webhook_config --url https://portal.example/ --ca-file ca.crt \
        [--cluster gpu-east] [--token-in-path] [--failure-policy Fail] | kubectl apply -f -

`kube_webhook_install` applies the same configurations itself, and can make and keep the certificate.
What the configurations say: allocations/webhook_setup.py.
"""
from __future__ import annotations

import yaml
from django.core.management.base import BaseCommand

from allocations.management.webhook_options import add_options, configurations


class Command(BaseCommand):
    help = "Print the admission webhook configurations (YAML) that make a cluster ask the portal about team pods."

    def add_arguments(self, parser) -> None:
        add_options(parser, install=False)

    def handle(self, *args, **options) -> None:
        documents, _ = configurations(options)
        self.stdout.write(yaml.safe_dump_all(documents, sort_keys=False), ending="")
