"""Bare-metal hosts: a reservation is enforced as leases of GPUs (or MIG instances) held by the host's agent.

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

from allocations import units
from allocations.apply.backends.base import BackendPending, BackendRejected, SyncReport
from allocations.apply.desired import ClusterDesired
from common.dispatch import enqueue_after_commit
from allocations.apply.selectors import ENFORCED_STATES
from allocations.booking import mig_instance_id
from allocations.models import Allocation, ApplyJob, HostLeaseReport, Reservation
from common.channel_layer import send_to_groups
from inventory.models import Cluster, Node
from inventory.sharing import REPLICA_MODES, replicas_of

log = logging.getLogger(__name__)


def lease_key(reservation_id: int, device: str) -> str:
    """A lease's key: "<reservation id>:<GPU UUID>", or for a MIG instance "<reservation id>:<instance id>"
    (allocations.booking.mig_instance_id: its MIG device UUID, else "<GPU UUID>/<start slice>")."""
    return f"{reservation_id}:{device}"


def _active_allocations(now: datetime):
    return Allocation.objects.filter(reservation__state__in=ENFORCED_STATES, starts_at__lte=now, ends_at__gt=now)


def host_leases(node: Node, *, now: datetime | None = None) -> list[dict]:
    """The leases `node`'s agent should hold now, in the form the agent API sends them.

    One lease per reservation and GPU for exclusive, time_slicing, mps and vgpu grants: the k
    shares of one reservation on one GPU (its rows, each a run of slots) are one lease with "shares": k of "replicas": N
    (the pool's sharing_config), and for mps/vgpu "memory_mib" and "cores_pct" (summed over the
    rows; k/N of the card where the rows carry none). One lease per instance for mig grants,
    with "mig_profile", "mig_start", "mig_uuid" and "memory_mib". Every lease says its "mode"
    (the grant's), which tells the agent what to write into the reservation's env file.
    """
    now = now or timezone.now()
    rows = (
        _active_allocations(now).filter(gpu__node=node)
        .order_by("reservation_id", "gpu__index", "mig_start", "share_from")
        .values_list("reservation_id", "reservation__team__slug", "reservation__requested_by__username",
                     "reservation__pool__sharing_config", "gpu__uuid", "gpu__index", "gpu__memory_mib",
                     "gpu__mig_devices", "mode", "mig_profile", "mig_start", "memory_mib", "cores_pct", "ends_at",
                     "milli")
    )
    leases: dict[str, dict] = {}
    for (reservation_id, team, username, config, gpu_uuid, gpu_index, gpu_memory, mig_devices, mode, mig_profile,
         mig_start, memory_mib, cores_pct, ends_at, milli) in rows:
        lease = {"reservation": reservation_id, "team": team, "user": username or "", "gpu_uuid": gpu_uuid,
                 "gpu_index": gpu_index, "ends_at": ends_at.isoformat(), "mode": mode}
        if mode == "mig":
            instance = mig_instance_id(gpu_uuid, mig_devices, mig_profile, mig_start)
            key = lease_key(reservation_id, instance)
            leases[key] = {"key": key, **lease, "mig_profile": mig_profile, "mig_start": mig_start,
                           "mig_uuid": instance, "memory_mib": memory_mib}
            continue
        key = lease_key(reservation_id, gpu_uuid)
        held = leases.get(key)
        if held is None:
            held = leases[key] = {"key": key, **lease}
            if mode in REPLICA_MODES:
                held.update(shares=0, replicas=replicas_of(config) or 1)
            if mode in ("mps", "vgpu"):
                held.update(memory_mib=0, cores_pct=0)
        elif ends_at.isoformat() > held["ends_at"]:
            held["ends_at"] = ends_at.isoformat()  # rows of one reservation end together; the last counts
        if mode in REPLICA_MODES:
            held["shares"] += units.share_slots(milli, held["replicas"])  # a row holds a run of slots
        if mode in ("mps", "vgpu"):
            held["memory_mib"] += memory_mib or 0
            held["cores_pct"] += cores_pct or 0
        held["_gpu_memory"] = gpu_memory
    for lease in leases.values():
        gpu_memory = lease.pop("_gpu_memory", None)
        if lease["mode"] == "mps":  # rows without their caps (booked before they were stored): k/N of the card
            share = lease["shares"] / lease["replicas"]
            lease["memory_mib"] = lease["memory_mib"] or int(gpu_memory * share)
            lease["cores_pct"] = min(100, lease["cores_pct"] or max(1, int(100 * share)))
    return list(leases.values())


def wanted_lease_keys(grants) -> dict[str, set[str]]:
    """{node name: the lease keys host_leases sends it} for `grants` (desired.Grant): one per reservation
    and GPU, except a MIG grant's, which is one per instance. A Grant does not carry the instance (its
    start slice and the GPU's reported devices), so for grants of MIG pools the rows are read again, with
    the same mig_instance_id host_leases names them by; other grants cost no query."""
    wanted: dict[str, set[str]] = defaultdict(set)
    grants = list(grants)
    mig = defaultdict(set)
    mig_reservations = {grant.reservation_id for grant in grants if grant.sharing_mode == "mig"}
    if mig_reservations:
        for reservation_id, gpu_uuid, mig_devices, profile, start in (
                _active_allocations(timezone.now()).filter(reservation_id__in=mig_reservations, mode="mig")
                .values_list("reservation_id", "gpu__uuid", "gpu__mig_devices", "mig_profile", "mig_start")):
            mig[(reservation_id, gpu_uuid)].add(
                lease_key(reservation_id, mig_instance_id(gpu_uuid, mig_devices, profile, start)))
    for grant in grants:
        wanted[grant.node_name] |= (mig.get((grant.reservation_id, grant.gpu_uuid))
                                    or {lease_key(grant.reservation_id, grant.gpu_uuid)})
    return wanted


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
    reads_pools = False  # each lease carries its mode's parameters (host_leases reads them); no pool-wide setup

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster

    def sync(self, desired: ClusterDesired, *, teams: Collection[str] | None = None) -> SyncReport:
        wanted = wanted_lease_keys(grant for team in desired.teams if teams is None or team.team_slug in teams
                                   for grant in team.grants)
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
