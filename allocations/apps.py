from django.apps import AppConfig


class AllocationsConfig(AppConfig):
    name = "allocations"
    verbose_name = "Allocations: quotas and reservations"

    def ready(self) -> None:
        from inventory.signals import gpu_moving, node_health_changed

        node_health_changed.connect(_start_failover, dispatch_uid="allocations.failover")
        gpu_moving.connect(_refuse_moving_a_booked_gpu, dispatch_uid="allocations.gpu_moving")


def _start_failover(sender, *, node_id: int, healthy: bool, reason: str = "", **_) -> None:
    """A node went unhealthy: move its reservations (in a task; the beat sweep is the backstop)."""
    if healthy:
        return
    from allocations import tasks

    tasks.failover_node.delay(node_id, reason)


def _refuse_moving_a_booked_gpu(sender, *, gpu_id: int, pool_id: int | None, fields: list[str], **_) -> None:
    """A GPU booked now or later stays in its pool and on its node: its reservation (and the apply
    backends' lease or pod) name this pool and host. 409 gpu_booked; release or let the booking end first."""
    from django.utils import timezone

    from allocations.models import Allocation
    from allocations.selectors import LATEST_INSTANT
    from common.errors import Conflict
    from inventory.models import GpuPool

    if pool_id is not None:
        # Placement's lock: no booking lands on the GPU between this check and the move.
        GpuPool.objects.select_for_update().filter(pk=pool_id).first()
    if Allocation.objects.filter(gpu_id=gpu_id).booked_during(timezone.now(), LATEST_INSTANT).exists():
        raise Conflict(f"The GPU is booked now or later; it cannot change {' or '.join(fields)} until those "
                       "bookings end or are released.", field=fields[0], rule="gpu_booked")

