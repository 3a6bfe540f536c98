"""Bare-metal hosts: a reservation is enforced as leases of GPU UUIDs held by the host's agent.

Agents call the portal, never the other way round (hosts sit behind firewalls), so
applying is a pull: the agent polls `POST /api/v1/agent/leases/` with the lease keys it
holds and gets back the ones it should hold (:func:`host_leases`), writes them where
the host's job launcher reads them, and says so on its next poll (:class:`HostLeaseReport`).
:meth:`AgentBackend.sync` therefore checks the agent's last report against what should
exist: an apply is done when the host confirms, and until then it raises
:class:`BackendPending`, which the apply job retries with backoff up to its deadline.

A host that never ran an agent (added by hand) cannot enforce anything: the lease is kept
in the portal only, and the job's target says so.
"""
from __future__ import annotations

from collections import defaultdict
from collections.abc import Collection
from datetime import datetime

from django.utils import timezone

from allocations.apply.backends.base import BackendPending, SyncReport
from allocations.apply.desired import ClusterDesired
from allocations.apply.selectors import ENFORCED_STATES
from allocations.models import Allocation, HostLeaseReport, Reservation
from inventory.models import Cluster, Node


def lease_key(reservation_id: int, gpu_uuid: str) -> str:
    return f"{reservation_id}:{gpu_uuid}"


def host_leases(node: Node, *, now: datetime | None = None) -> list[dict]:
    """The leases `node`'s agent should hold now, in the form the agent API sends them."""
    now = now or timezone.now()
    allocations = (
        Allocation.objects.filter(gpu__node=node, reservation__state__in=ENFORCED_STATES,
                                  starts_at__lte=now, ends_at__gt=now)
        .select_related("gpu", "reservation__team").order_by("reservation_id", "gpu__index")
    )
    return [
        {"key": lease_key(a.reservation_id, a.gpu.uuid), "reservation": a.reservation_id,
         "team": a.reservation.team.slug, "gpu_uuid": a.gpu.uuid, "gpu_index": a.gpu.index,
         "ends_at": a.ends_at.isoformat()}
        for a in allocations
    ]


def host_lease_report(*, node: Node, held: list[str], now: datetime | None = None) -> None:
    """Record the lease keys the agent says it holds."""
    HostLeaseReport.objects.update_or_create(node=node, defaults={"held": sorted(set(held)),
                                                                  "reported_at": now or timezone.now()})


class AgentBackend:
    name = "agent"

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster

    def sync(self, desired: ClusterDesired, *, teams: Collection[str] | None = None) -> SyncReport:
        wanted: dict[str, set[str]] = defaultdict(set)
        for team in desired.teams:
            if teams is None or team.team_slug in teams:
                for grant in team.grants:
                    wanted[grant.node_name].add(lease_key(grant.reservation_id, grant.gpu_uuid))
        nodes = Node.objects.filter(cluster=self.cluster).select_related("lease_report").order_by("name")
        held = {node.name: set(getattr(node, "lease_report", None).held) if hasattr(node, "lease_report") else set()
                for node in nodes}
        relevant = self._relevant_reservations(teams, held)
        report = SyncReport(target=f"agents of {self.cluster.slug}" + (f" (teams {', '.join(teams)})" if teams else ""))
        waiting = []
        for node in nodes:
            have = {key for key in held[node.name] if relevant is None or int(key.split(":", 1)[0]) in relevant}
            want = wanted.get(node.name, set())
            missing, extra = sorted(want - have), sorted(have - want)
            if not (missing or extra):
                continue
            if node.last_seen_at is None:
                continue  # no agent on this host: nothing can be enforced or confirmed there
            drift = _describe(node.name, missing, extra)
            if teams is None:
                report.changes.append(f"{drift}; the agent gets the right set on its next poll")
            elif not node.healthy and not missing:
                # A silent host cannot confirm that it dropped leases; it drops them on its first poll
                # when it comes back, and nobody can run on it meanwhile. Waiting would only block.
                continue
            elif not node.healthy:
                waiting.append(f"{drift}, and the host is not reporting")
            else:
                waiting.append(drift)
        if waiting:
            raise BackendPending("waiting for host agents to confirm: " + "; ".join(waiting))
        return report

    @staticmethod
    def _relevant_reservations(teams: Collection[str] | None, held: dict[str, set[str]]) -> set[int] | None:
        """With `teams` given, only leases of those teams' reservations are compared."""
        if teams is None:
            return None
        ids = {int(key.split(":", 1)[0]) for keys in held.values() for key in keys}
        return set(Reservation.objects.filter(pk__in=ids, team__slug__in=list(teams)).values_list("pk", flat=True))


def _describe(host: str, missing: list[str], extra: list[str]) -> str:
    parts = []
    if missing:
        parts.append(f"host {host} does not hold lease(s) {', '.join(missing)} yet")
    if extra:
        parts.append(f"host {host} still holds lease(s) {', '.join(extra)}")
    return " and ".join(parts)
