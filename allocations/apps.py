from django.apps import AppConfig


class AllocationsConfig(AppConfig):
    name = "allocations"
    verbose_name = "Allocations: quotas and reservations"

    def ready(self) -> None:
        from inventory.signals import node_health_changed

        node_health_changed.connect(_start_failover, dispatch_uid="allocations.failover")


def _start_failover(sender, *, node_id: int, healthy: bool, reason: str = "", **_) -> None:
    """A node went unhealthy: move its reservations (in a task; the beat sweep is the backstop)."""
    if healthy:
        return
    from allocations import tasks

    tasks.failover_node.delay(node_id, reason)
