"""Periodic inventory upkeep."""
from __future__ import annotations

import logging

from celery import shared_task
from django.conf import settings

from inventory import services

log = logging.getLogger(__name__)


@shared_task(name="inventory.tasks.mark_silent_hosts")
def mark_silent_hosts() -> list[int]:
    ids = services.nodes_mark_silent(timeout=settings.HOST_SILENCE_TIMEOUT)
    if ids:
        log.warning("hosts %s stopped reporting; marked unhealthy", ids)
    return ids
