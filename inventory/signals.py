"""Signals inventory sends so other apps can react without inventory importing them.

``node_health_changed`` is sent after the commit that changed a node's health, with
``node_id``, ``healthy`` (the new value) and ``reason`` (why, in words for people:
"host stopped reporting for 60 s", "Kubernetes node NotReady: KubeletStopped").
allocations listens to move the allocations of a node that went unhealthy (failover).

``gpu_moving`` is sent inside the transaction of a GPU about to change pool or node, with
``gpu_id``, ``pool_id`` (its pool as stored, maybe None) and ``fields`` (the names that
change). A receiver refuses the move by raising a common.errors.ApplicationError:
allocations refuses a GPU that is booked now or later (its reservation would hold a GPU
of another pool or host).
"""
from django.dispatch import Signal

node_health_changed = Signal()
gpu_moving = Signal()
