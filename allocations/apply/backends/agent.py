"""Bare-metal hosts: a reservation is enforced as leases of GPU UUIDs held by the host's agent.

Agents open the connections, never the portal (hosts sit behind firewalls): each agent
keeps a WebSocket (`/ws/agent/`, :mod:`allocations.consumers`) on which the portal
pushes the host's leases (:func:`host_leases`) when they change, and polls
`POST /api/v1/agent/leases/` as a fallback. The agent writes the leases where the host's
job launchers read them and answers what it holds, what it could not apply and which
GPUs run processes without a lease (:class:`HostLeaseReport`).
:meth:`AgentBackend.sync` pushes what should exist and checks the agent's last answer:
an apply is done when the host confirms; until then it raises :class:`BackendPending`,
which the apply job retries with backoff up to its deadline, and an answer from the
agent wakes the waiting jobs at once (:func:`host_lease_report`). A lease the host
refuses (a GPU it does not have) fails the apply with the host's reason.

A host that never ran an agent (added by hand) cannot enforce anything: the lease is kept
in the portal only, and the job's target says so.
"""
from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Collection
from datetime import datetime

from django.db.models import Q
from django.utils import timezone

from allocations.apply.backends.base import BackendPending, BackendRejected, SyncReport
from allocations.apply.desired import ClusterDesired
from common.dispatch import enqueue_after_commit
from allocations.apply.selectors import ENFORCED_STATES
from allocations.models import Allocation, ApplyJob, HostLeaseReport, Reservation
from common.channel_layer import send_to_groups
from inventory.models import Cluster, Node

log = logging.getLogger(__name__)


def lease_key(reservation_id: int, gpu_uuid: str) -> str:
    return f"{reservation_id}:{gpu_uuid}"


def host_leases(node: Node, *, now: datetime | None = None) -> list[dict]:
    """The leases `node`'s agent should hold now, in the form the agent API sends them."""
    now = now or timezone.now()
    allocations = (
        Allocation.objects.filter(gpu__node=node, reservation__state__in=ENFORCED_STATES,
                                  starts_at__lte=now, ends_at__gt=now)
        .select_related("gpu", "reservation__team", "reservation__requested_by")
        .order_by("reservation_id", "gpu__index")
    )
    return [
        {"key": lease_key(a.reservation_id, a.gpu.uuid), "reservation": a.reservation_id,
         "team": a.reservation.team.slug,
         "user": a.reservation.requested_by.username if a.reservation.requested_by else "",
         "gpu_uuid": a.gpu.uuid, "gpu_index": a.gpu.index, "ends_at": a.ends_at.isoformat()}
        for a in allocations
    ]


def agent_group(node_id: int) -> str:
    """The channel-layer group of one host's lease channel."""
    return f"agent.node.{node_id}"


def _tell_lease_channels(node_ids: Collection[int], event: str, doing: str) -> None:
    """Send `event` to the hosts' open lease channels. A failure is logged, never raised: each
    channel also acts on its next message, and the agents' HTTP poll is the fallback."""
    if not node_ids:
        return
    try:
        send_to_groups({agent_group(node_id): {"type": event} for node_id in node_ids})
    except Exception:
        log.warning("could not %s of nodes %s", doing, sorted(node_ids), exc_info=True)


def push_leases(node_ids: Collection[int]) -> None:
    """Tell the hosts' open lease channels that their leases changed (they fetch and send them)."""
    _tell_lease_channels(node_ids, "leases.changed", "push the leases")


def recheck_channels(node_ids: Collection[int]) -> None:
    """Make the hosts' open lease channels check their token again (it was revoked or deleted, or the host was)."""
    _tell_lease_channels(node_ids, "agent.recheck", "ask the lease channels to check their token")


def host_lease_report(*, node: Node, held: list[str], failed: dict[str, str] | None = None,
                      unleased_in_use: list[str] | None = None, now: datetime | None = None) -> None:
    """Record what the agent says it holds, and wake the apply jobs waiting for this host."""
    now = now or timezone.now()
    unleased = sorted(set(unleased_in_use or []))
    before = HostLeaseReport.objects.filter(node=node).values_list("unleased_in_use", flat=True).first() or []
    report, _ = HostLeaseReport.objects.update_or_create(node=node, defaults={
        "held": sorted(set(held)), "failed": dict(failed or {}), "unleased_in_use": unleased, "reported_at": now,
    })
    # GPUs busy outside the portal: nothing the portal can repair, and the host's page shows them. Told
    # when it starts or changes, not on every report or reconcile.
    if unleased and unleased != before:
        log.warning("host %s: GPU(s) %s run processes without a lease (not booked through the portal)", node.name,
                    ", ".join(unleased))
    elif before and not unleased:
        log.info("host %s: no GPU runs processes without a lease any more", node.name)
    waiting = list(ApplyJob.objects.filter(cluster_id=node.cluster_id, backend="agent",
                                           status=ApplyJob.Status.RETRYING).values_list("pk", flat=True))
    if waiting:
        ApplyJob.objects.filter(pk__in=waiting, status=ApplyJob.Status.RETRYING).update(next_attempt_at=now)
        for pk in waiting:
            enqueue_after_commit("allocations.tasks.run_apply_job", pk)


class AgentBackend:
    name = "agent"
    reads_pools = False  # leases are per GPU; a host's sharing setup is not the agent's business

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster

    def sync(self, desired: ClusterDesired, *, teams: Collection[str] | None = None) -> SyncReport:
        wanted: dict[str, set[str]] = defaultdict(set)
        for team in desired.teams:
            if teams is None or team.team_slug in teams:
                for grant in team.grants:
                    wanted[grant.node_name].add(lease_key(grant.reservation_id, grant.gpu_uuid))
        nodes = Node.objects.filter(cluster=self.cluster).select_related("lease_report").order_by("name")
        if teams is not None:
            nodes = nodes.filter(Q(name__in=list(wanted)) | Q(pk__in=self._undoing_on(teams)))
        nodes = list(nodes)
        reports = {node.name: _report_of(node) for node in nodes}
        held = {name: set(r.held) if r else set() for name, r in reports.items()}
        relevant = self._relevant_reservations(teams, held)
        report = SyncReport(target=f"agents of {self.cluster.slug}" + (f" (teams {', '.join(teams)})" if teams else ""))
        waiting, refused, push = [], [], []
        for node in nodes:
            have = {key for key in held[node.name] if relevant is None or int(key.split(":", 1)[0]) in relevant}
            want = wanted.get(node.name, set())
            missing, extra = sorted(want - have), sorted(have - want)
            if not (missing or extra):
                continue
            if node.last_seen_at is None:
                continue  # no agent on this host: nothing can be enforced or confirmed there
            failed = reports[node.name].failed if reports[node.name] else {}
            refused.extend(f"host {node.name} refused lease {key}: {failed[key]}" for key in missing if key in failed)
            push.append(node.pk)
            drift = _describe(node.name, missing, extra)
            if teams is None:
                report.changes.append(f"{drift}; the right set was sent to its agent again")
            elif not node.healthy and not missing:
                # A silent host cannot confirm that it dropped leases; it drops them on its first poll
                # when it comes back, and nobody can run on it meanwhile. Waiting would only block.
                continue
            elif not node.healthy:
                waiting.append(f"{drift}, and the host is not reporting")
            else:
                waiting.append(drift)
        push_leases(push)
        if refused:
            raise BackendRejected("; ".join(refused))
        if waiting:
            raise BackendPending("waiting for host agents to confirm: " + "; ".join(waiting))
        return report

    def _undoing_on(self, teams: Collection[str]):
        """Hosts holding GPUs of the teams' reservations being undone (a subquery of node ids).

        A team's apply or undo looks only at these and at the hosts the team should hold
        leases on, so its cost does not grow with the cluster; a stale lease anywhere else
        is the reconcile's business (``teams=None`` looks at every host)."""
        return (Allocation.objects.filter(gpu__node__cluster=self.cluster, reservation__team__slug__in=list(teams),
                                          reservation__state=Reservation.State.RELEASING)
                .values("gpu__node_id"))

    @staticmethod
    def _relevant_reservations(teams: Collection[str] | None, held: dict[str, set[str]]) -> set[int] | None:
        """With `teams` given, only leases of those teams' reservations are compared."""
        if teams is None:
            return None
        ids = {int(key.split(":", 1)[0]) for keys in held.values() for key in keys}
        return set(Reservation.objects.filter(pk__in=ids, team__slug__in=list(teams)).values_list("pk", flat=True))


def _report_of(node: Node) -> HostLeaseReport | None:
    try:
        return node.lease_report
    except HostLeaseReport.DoesNotExist:
        return None


def _describe(host: str, missing: list[str], extra: list[str]) -> str:
    parts = []
    if missing:
        parts.append(f"host {host} does not hold lease(s) {', '.join(missing)} yet")
    if extra:
        parts.append(f"host {host} still holds lease(s) {', '.join(extra)}")
    return " and ".join(parts)
