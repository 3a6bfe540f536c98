from django.apps import AppConfig
from django.utils.translation import gettext_lazy


class AllocationsConfig(AppConfig):
    name = "allocations"
    verbose_name = gettext_lazy("Allocations: quotas and reservations")

    def ready(self) -> None:
        from django.db.models.signals import post_delete, post_save

        from inventory.models import HostToken, Node
        from inventory.signals import gpu_moving, node_health_changed

        node_health_changed.connect(_start_failover, dispatch_uid="allocations.failover")
        gpu_moving.connect(_refuse_moving_a_booked_gpu, dispatch_uid="allocations.gpu_moving")
        # A revoked or deleted host token, or a deleted host, closes the host's open lease channels at once.
        post_save.connect(_recheck_token_channels, sender=HostToken, dispatch_uid="allocations.token_saved")
        post_delete.connect(_recheck_token_channels, sender=HostToken, dispatch_uid="allocations.token_deleted")
        post_delete.connect(_recheck_node_channels, sender=Node, dispatch_uid="allocations.node_deleted")


def _start_failover(sender, *, node_id: int, healthy: bool, reason: str = "", **_) -> None:
    """A node went unhealthy: move its reservations (in a task; the beat sweep is the backstop)."""
    if healthy:
        return
    from common.dispatch import enqueue

    enqueue("allocations.tasks.failover_node", node_id, reason)


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
        from django.utils.translation import gettext

        raise Conflict(gettext("The GPU is booked now or later; it cannot change %(fields)s until those bookings end "
                               "or are released.") % {"fields": " or ".join(fields)}, field=fields[0],
                       rule="gpu_booked")


def _recheck_token_channels(sender, *, instance, created: bool = False, **_) -> None:
    """A host token changed: its host's open lease channels look at their token again, after commit."""
    if created:
        return  # a new token closes nothing
    from django.db import transaction

    from allocations.apply.backends.agent import recheck_channels
    from inventory.models import Node

    node_ids = list(Node.objects.filter(cluster_id=instance.cluster_id, name=instance.host_name)
                    .values_list("pk", flat=True))
    transaction.on_commit(lambda: recheck_channels(node_ids))


def _recheck_node_channels(sender, *, instance, **_) -> None:
    from django.db import transaction

    from allocations.apply.backends.agent import recheck_channels

    node_id = instance.pk  # Django clears it once the delete is done
    transaction.on_commit(lambda: recheck_channels([node_id]))
