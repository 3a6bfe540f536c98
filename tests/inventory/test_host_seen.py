"""A host whose telemetry arrives on its agent's socket is alive: seen without HTTP heartbeats."""
from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from audit.models import AuditEntry
from inventory import services
from inventory.models import Node

pytestmark = pytest.mark.django_db


def test_telemetry_marks_hosts_seen_at_most_every_few_seconds_and_a_silent_one_rejoins(world):
    now = timezone.now()
    a, b = Node.objects.get(name="node-a"), Node.objects.get(name="node-b")
    Node.objects.filter(pk=a.pk).update(last_seen_at=now - timedelta(minutes=2), healthy=True)
    Node.objects.filter(pk=b.pk).update(last_seen_at=now - timedelta(minutes=5), healthy=False)
    services.hosts_seen(node_ids=[a.pk, b.pk], now=now)
    a.refresh_from_db()
    b.refresh_from_db()
    assert a.last_seen_at == now and a.healthy
    assert b.last_seen_at == now and b.healthy
    rejoined = AuditEntry.objects.filter(object_id=b.pk, content_type__model="node",
                                          action=AuditEntry.Action.UPDATE)
    assert rejoined.count() == 1 and "healthy" in str(rejoined.get().changes)
    services.hosts_seen(node_ids=[a.pk], now=now + timedelta(seconds=2))  # within SEEN_RESOLUTION: not rewritten
    a.refresh_from_db()
    assert a.last_seen_at == now
