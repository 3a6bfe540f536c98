"""Signals inventory sends so other apps can react without inventory importing them.

``node_health_changed`` is sent after the commit that changed a node's health, with
``node_id``, ``healthy`` (the new value) and ``reason`` (why, in words for people:
"host stopped reporting for 60 s", "Kubernetes node NotReady: KubeletStopped").
allocations listens to move the allocations of a node that went unhealthy (failover).
"""
from django.dispatch import Signal

node_health_changed = Signal()
