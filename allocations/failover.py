"""Failover: when a node dies, its reservations move to healthy GPUs of the same pool.

A node goes unhealthy when its host agent stops reporting or Kubernetes says NotReady
(inventory sends ``node_health_changed``; the beat sweep also looks for unhealthy nodes
still holding work, so a lost signal loses nothing). Each live reservation with GPUs on
that node is placed again, as a whole (its GPUs belong together on one node), for what
is left of its window: the placement engine picks healthy GPUs with the pool's policy,
the old allocations end now (history stays), and a running reservation goes back through
applying so the new GPUs are enforced and the old ones released. If nothing fits, the
reservation fails with the reason. Either way the owners get an email.

A reservation under a reclaim notice (allocations/reclaim.py) is placed only until the notice's end,
when its GPUs are taken back as it was told; if nothing fits, one that asked `requeue` still waits in
the queue again for the rest of its time, as its notice said.
"""
from __future__ import annotations

import logging
from datetime import datetime

from django.db import transaction
from django.db.models import F
from django.utils import timezone
from django.utils.translation import gettext_noop

from allocations import booking, notices, queue
from allocations.messages import Msg, in_english
from allocations.apply import jobs
from allocations.models import Allocation, ApplyJob, Reservation
from allocations.transitions import move, record
from common.errors import instant
from inventory.models import GpuPool, Node

log = logging.getLogger(__name__)
State = Reservation.State


def _held(now: datetime):
    """Allocations of live reservations that still matter: they end after now and are not empty
    (an empty window marks a booking given up before it began)."""
    return Allocation.objects.filter(ends_at__gt=now, reservation__state__in=Reservation.LIVE_STATES).filter(
        ends_at__gt=F("starts_at"))


def unhealthy_nodes_holding_ids(now: datetime | None = None) -> list[int]:
    """Unhealthy nodes that still hold GPUs of live reservations now or later."""
    now = now or timezone.now()
    return list(_held(now).filter(gpu__node__healthy=False).values_list("gpu__node_id", flat=True)
                .order_by("gpu__node_id").distinct()[:200])


def node_failover(*, node_id: int, reason: str = "", now: datetime | None = None) -> dict:
    """Move every live reservation off `node_id` if it is unhealthy. Safe to run twice."""
    now = now or timezone.now()
    node = Node.objects.filter(pk=node_id).first()
    if node is None or node.healthy:
        return {"node": node_id, "moved": [], "failed": []}
    why = Msg.verbatim(reason) if reason else Msg(gettext_noop("node %(node)s is unhealthy"), node=node.name)
    moved, failed = [], []
    ids = sorted(set(_held(now).filter(gpu__node_id=node_id).values_list("reservation_id", flat=True)))
    for reservation_id in ids:
        outcome = reservation_move_off_node(reservation_id=reservation_id, node=node, reason=why, now=now)
        if outcome == "moved":
            moved.append(reservation_id)
        elif outcome == "failed":
            failed.append(reservation_id)
    if ids:
        log.warning("failover of %s (%s): moved %s, failed %s", node.name, in_english(why), moved, failed)
    return {"node": node.name, "moved": moved, "failed": failed}


@transaction.atomic
def reservation_move_off_node(*, reservation_id: int, node: Node, reason: Msg | str, now: datetime) -> str:
    """Place the rest of the reservation's window again, off `node`. Returns moved, failed or skipped."""
    pool_id = Reservation.objects.filter(pk=reservation_id).values_list("pool_id", flat=True).first()
    if pool_id is None:
        return "skipped"
    # Same lock order as reservation_create: pool, then reservation.
    pool = GpuPool.objects.select_for_update().get(pk=pool_id)
    reservation = (Reservation.objects.select_for_update(of=("self",)).select_related("team", "requested_by")
                   .filter(pk=reservation_id, state__in=Reservation.LIVE_STATES).first())
    if reservation is None or not _held(now).filter(reservation=reservation, gpu__node=node).exists():
        return "skipped"
    start = max(now, reservation.starts_at)
    # Under a reclaim notice (allocations/reclaim.py) it holds GPUs only until the notice's end, as its cut
    # grants said: the new ones end there too, so it hands over at the time it was told, and a withdrawal
    # (reclaim.call_off_needless) gives them back their old end as it would the grants the notice cut.
    end = reservation.ends_at if reservation.preempt_at is None else min(reservation.ends_at, reservation.preempt_at)
    # Let go of the current GPUs from `start` on; the part already used stays as history.
    reservation.allocations.filter(ends_at__gt=start, starts_at__lt=start).update(ends_at=start)
    reservation.allocations.filter(starts_at__gte=start).update(ends_at=F("starts_at"))  # empty: never used
    if end <= start:
        # Its notice has run out and the sweep has not taken it back yet: that takes it back (and requeues
        # one that asked to be) through the normal path; there is nothing left to place.
        return "skipped"
    try:
        grants = booking.choose(booking.pool_snapshot(pool.pk, start, end),
                                booking.shape_of(reservation, pool), policy=pool.placement_policy)
    except booking.BookingRefused as refused:
        message = Msg(gettext_noop("Its GPUs were on %(node)s, which failed (%(reason)s), and no healthy GPUs of "
                                   "pool %(pool)s are free for the rest of the window: %(why)s"),
                      node=node.name, reason=reason, pool=pool.slug, why=refused.msg)
        move(reservation, State.FAILED, reason=message, now=now)
        notices.notify_owners(reservation, Msg(gettext_noop("Reservation #%(id)s failed: node %(node)s is down"),
                                               id=reservation.pk, node=node.name), message,
                              event="reservation.failed")
        if reservation.preempt_at is not None and reservation.requeue:
            # Its notice told it that it waits in the queue again for the rest of its time once its GPUs are
            # taken back: losing them sooner, to a dead node, does not take that away.
            queue.requeue_rest(reservation, reservation.ends_at - start, now=now, reason=Msg(gettext_noop(
                "Requeued for the rest of reservation #%(id)s (%(span)s), whose node %(node)s failed while it was "
                "under a reclaim notice."), id=reservation.pk, span=queue.span(reservation.ends_at - start),
                node=node.name))
        jobs.reconcile_enqueue(cluster=node.cluster, now=now)
        queue.kick(pool.pk)
        return "failed"
    booking.grants_write(reservation_id=reservation.pk, grants=grants, start=start, end=end)
    new_nodes = sorted(set(Node.objects.filter(gpus__id__in=[g.gpu_id for g in grants])
                           .values_list("name", flat=True)))
    if end < reservation.ends_at:
        message = Msg(gettext_noop("Moved from %(node)s to %(nodes)s until %(at)s, when its reclaim notice takes "
                                   "them back: %(reason)s."), node=node.name, nodes=", ".join(new_nodes),
                      at=instant(end), reason=reason)
    else:
        message = Msg(gettext_noop("Moved from %(node)s to %(nodes)s: %(reason)s."), node=node.name,
                      nodes=", ".join(new_nodes), reason=reason)
    if reservation.state == State.SCHEDULED:
        record(reservation, from_state=State.SCHEDULED, to_state=State.SCHEDULED, actor=None, reason=message)
    else:
        if reservation.state == State.APPLYING:
            reservation.apply_jobs.filter(status__in=ApplyJob.OPEN_STATUSES).update(
                status=ApplyJob.Status.FAILED, finished_at=now, error="Superseded: the reservation moved.")
        move(reservation, State.APPLYING, reason=message)
        jobs.jobs_create(reservation=reservation, action=ApplyJob.Action.APPLY, now=now)
        jobs.reconcile_enqueue(cluster=node.cluster, now=now)  # removes what the dead node's cluster still has
    notices.notify_owners(reservation, Msg(gettext_noop("Reservation #%(id)s moved off %(node)s"), id=reservation.pk,
                                           node=node.name), message, event="reservation.moved")
    queue.kick(pool.pk)  # the move may take room the queue's plan was counting on: promises are told anew
    return "moved"

