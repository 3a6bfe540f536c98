"""Alert evaluation with Prometheus/Alertmanager semantics, state in the database.

Every ALERT_EVALUATE_SECONDS the periodic task calls `alerts_evaluate`. For each enabled
rule it measures every subject (GPU, node, pool or team) from the hot cache and the
inventory, then per subject:

- condition true, no open alert → a `pending` alert (active_since = now);
- pending for at least `for_seconds` → `firing`, one mail (unless silenced);
- still firing after `repeat_seconds` since the last mail → one more mail;
- condition false or no data → a firing alert becomes `resolved` with one mail (only if
  its firing mail went out); a pending one is dropped, as Prometheus does.

Each transition is a conditional UPDATE on the row's state, and so is each mail no
transition claims (a repeat, or a firing mail a silence held back), on what the row says
of its mails; so two evaluations running at once send each mail once. Mails go out after
commit. A partial unique index keeps at most one open alert per rule and subject (the
dedup rule).
"""
from __future__ import annotations

import logging
from collections import defaultdict
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.conf import settings
from django.contrib.auth import get_user_model
from django.db import transaction
from django.urls import reverse
from django.utils import timezone, translation
from django.utils.formats import number_format
from django.utils.translation import gettext as _

from allocations.models import Allocation
from allocations.selectors import with_occupancy
from common.notifications import mail_after_commit
from inventory.models import Cluster, Gpu, GpuPool, Node
from monitoring import hot, live, shares
from monitoring.models import Alert, AlertRule, ClusterTelemetry, Metric, Scope, Silence
from teams.models import Membership, Team
from teams.notify import notify
from teams.preferences import speaking_to

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Observation:
    value: float
    label: str
    pool_id: int | None = None
    node_id: int | None = None
    team_id: int | None = None


class Fleet:
    """What one evaluation sees, loaded once and shared by every rule: GPUs, holders, latest samples."""

    def __init__(self, now: datetime) -> None:
        self.now = now
        self.gpus = list(Gpu.objects.values_list("id", "pool_id", "node_id", "node__cluster__slug", "node__name",
                                                 "index"))
        self.holder = dict(Allocation.objects.filter(starts_at__lte=now, ends_at__gt=now)
                           .values_list("gpu_id", "reservation__team_id"))
        self.latest = hot.latest_get((g[0], g[2]) for g in self.gpus)
        self._names: dict[str, dict[int, str]] = {}
        self._shares: list[shares.Share] | None = None

    def shares(self) -> list[shares.Share]:
        """The shares held now (read once, for the rules that need them)."""
        if self._shares is None:
            self._shares = shares.shares_now(self.now)
        return self._shares

    def names(self, model) -> dict[int, str]:
        key = model.__name__
        if key not in self._names:
            field = "slug"
            self._names[key] = dict(model.objects.values_list("pk", field))
        return self._names[key]

    def gpu_value(self, metric: str, latest: hot.Latest) -> float:
        return {Metric.GPU_UTIL: latest.util, Metric.GPU_IDLE_ALLOCATED: latest.util, Metric.GPU_MEMORY: latest.mem_pct,
                Metric.GPU_TEMPERATURE: latest.temp, Metric.GPU_POWER: latest.power}[metric]

    def observe(self, rule: AlertRule) -> dict[str, Observation]:
        if rule.metric == Metric.HOST_SILENT:
            return self._silent_hosts(rule)
        if rule.metric == Metric.POOL_ALLOCATION:
            return self._pool_allocation(rule)
        if rule.metric == Metric.SHARE_MEMORY:
            return self._share_memory(rule)
        if rule.metric == Metric.TELEMETRY_SILENT:
            return self._silent_clusters(rule)
        if rule.metric == Metric.GPU_UNLEASED:
            return self._unleased(rule)
        out: dict[str, Observation] = {}
        groups: dict[str, list] = defaultdict(list)
        for gpu_id, pool_id, node_id, cluster, node, index in self.gpus:
            if rule.pool_id is not None and pool_id != rule.pool_id:
                continue
            latest = self.latest.get(gpu_id)
            team_id = self.holder.get(gpu_id)
            if latest is None or (rule.metric == Metric.GPU_IDLE_ALLOCATED and team_id is None):
                continue
            value = self.gpu_value(rule.metric, latest)
            if rule.scope == Scope.GPU:
                # "Allocated but idle" is about a holder: a new holder starts its own for-duration and is
                # the one told, so the holder is part of the subject.
                subject = f"gpu:{gpu_id}"
                if rule.metric == Metric.GPU_IDLE_ALLOCATED:
                    subject += f":team:{team_id}"
                out[subject] = Observation(value, f"{cluster}/{node} GPU {index}", pool_id, node_id, team_id)
            elif rule.scope == Scope.NODE:
                groups[f"node:{node_id}"].append((value, f"{cluster}/{node}", pool_id, node_id, None))
            elif rule.scope == Scope.POOL and pool_id is not None:
                groups[f"pool:{pool_id}"].append((value, f"pool {self.names(GpuPool).get(pool_id)}", pool_id, None,
                                                  None))
            elif rule.scope == Scope.TEAM and team_id is not None:
                groups[f"team:{team_id}"].append((value, f"team {self.names(Team).get(team_id)}", None, None, team_id))
        for subject, items in groups.items():
            _value, label, pool_id, node_id, team_id = items[0]
            pools = {i[2] for i in items}
            out[subject] = Observation(sum(i[0] for i in items) / len(items), label,
                                       pool_id if len(pools) == 1 else None, node_id, team_id)
        return out

    def _silent_hosts(self, rule: AlertRule) -> dict[str, Observation]:
        nodes = Node.objects.filter(cluster__kind=Cluster.Kind.BAREMETAL, last_seen_at__isnull=False)
        if rule.pool_id is not None:
            nodes = nodes.filter(gpus__pool_id=rule.pool_id).distinct()
        pool_of = {n: p for _, p, n, *_ in self.gpus}
        return {f"node:{node.pk}": Observation((self.now - node.last_seen_at).total_seconds(),
                                               f"{node.cluster.slug}/{node.name}", pool_of.get(node.pk), node.pk)
                for node in nodes.select_related("cluster")}

    def _silent_clusters(self, rule: AlertRule) -> dict[str, Observation]:
        """Seconds since each Kubernetes cluster's telemetry was last read (since reading began, until a
        first read succeeds). A rule limited to a pool watches the clusters with GPUs in it."""
        rows = ClusterTelemetry.objects.select_related("cluster").exclude(cluster__telemetry_source="none")
        if rule.pool_id is not None:
            rows = rows.filter(cluster__nodes__gpus__pool_id=rule.pool_id).distinct()
        out = {}
        for row in rows:
            last = row.last_success_at or row.since
            why = f": {row.error[:120]}" if row.error else ""
            out[f"cluster:{row.cluster_id}"] = Observation(
                (self.now - last).total_seconds(), f"cluster {row.cluster.slug} telemetry ({row.source}){why}")
        return out

    def _unleased(self, rule: AlertRule) -> dict[str, Observation]:
        """Per GPU and namespace: pods the last read of a Kubernetes cluster found on a GPU their team holds
        no share of (or of a namespace that is no team's). The team, when there is one, is told."""
        gpus = {g[0]: g for g in self.gpus}
        out: dict[str, Observation] = {}
        for unleased in ClusterTelemetry.objects.exclude(unleased=[]).values_list("unleased", flat=True):
            for item in unleased:
                gpu = gpus.get(item.get("gpu"))
                if gpu is None:
                    continue
                gpu_id, pool_id, node_id, cluster, node, index = gpu
                if rule.pool_id is not None and pool_id != rule.pool_id:
                    continue
                subject = f"gpu:{gpu_id}:ns:{item['namespace']}"[:64]
                previous = out.get(subject)
                who = f"team {item['team']}" if item.get("team") else "no team's namespace"
                out[subject] = Observation(
                    (previous.value if previous else 0) + 1,
                    f"{cluster}/{node} GPU {index}: pods of {item['namespace']} ({who}) without a reservation",
                    pool_id, node_id, item.get("team_id"))
        return out

    def _share_memory(self, rule: AlertRule) -> dict[str, Observation]:
        """Each share's memory used (its processes, attributed at ingest) as a % of what it may use
        (shares.share_memory_mib). The subject is the holder's share: the reservation and its GPU (and
        MIG instance), so a GPU's next holder starts its own for-duration and is the one told."""
        gpus = {g[0]: g for g in self.gpus}
        out: dict[str, Observation] = {}
        for share in self.shares():
            gpu, latest = gpus.get(share.gpu_id), self.latest.get(share.gpu_id)
            if gpu is None or latest is None or share.allocated_mib <= 0:
                continue
            _gpu_id, pool_id, node_id, cluster, node, index = gpu
            if rule.pool_id is not None and pool_id != rule.pool_id:
                continue
            used = shares.used_mib(latest.shares, share.reservation_id, share.instance)
            subject, where = f"share:{share.reservation_id}:gpu:{share.gpu_id}", f"{cluster}/{node} GPU {index}"
            if share.mode == shares.MIG:
                subject += f":mig:{share.mig_start}"
                where += f" MIG {share.mig_profile} at slice {share.mig_start}"
            label = (f"{where}: reservation #{share.reservation_id} of team {share.team} "
                     f"({share.mode}, share {share.allocated_mib} MiB)")
            out[subject] = Observation(100.0 * used / share.allocated_mib, label, pool_id, node_id, share.team_id)
        return out

    def _pool_allocation(self, rule: AlertRule) -> dict[str, Observation]:
        pools = GpuPool.objects.all() if rule.pool_id is None else GpuPool.objects.filter(pk=rule.pool_id)
        return {f"pool:{p.pk}": Observation(100.0 * p.gpus_allocated / p.gpus_total, f"pool {p.slug}", p.pk)
                for p in with_occupancy(pools, self.now) if p.gpus_total}


def alerts_evaluate(*, now: datetime | None = None) -> dict[str, int]:
    """Evaluate every enabled rule once; returns how many alerts went pending, fired, resolved and mails sent."""
    now = now or timezone.now()
    fleet = Fleet(now)
    silences = _silences_at(now)
    totals: dict[str, int] = defaultdict(int)
    for rule in AlertRule.objects.filter(enabled=True).select_related("pool"):
        for key, n in _evaluate_rule(rule, fleet.observe(rule), now, silences).items():
            totals[key] += n
    disabled = AlertRule.objects.filter(enabled=False, alerts__state__in=Alert.OPEN_STATES).distinct()
    for rule in disabled.select_related("pool"):
        for key, n in rule_retired(rule, now=now, silences=silences).items():
            totals[key] += n
    return dict(totals)


def rule_retired(rule: AlertRule, *, now: datetime | None = None,
                 silences: list[Silence] | None = None) -> dict[str, int]:
    """A disabled or deleted rule observes nothing: its open alerts resolve, with the resolved mail
    where a firing one went out."""
    now = now or timezone.now()
    return _evaluate_rule(rule, {}, now, _silences_at(now) if silences is None else silences)


def _silences_at(now: datetime) -> list[Silence]:
    return list(Silence.objects.filter(starts_at__lte=now, ends_at__gt=now))


def on_rule_deleted(sender, instance: AlertRule, **kwargs) -> None:
    """pre_delete of a rule (API, admin, shell): its firing alerts are told resolved before they go."""
    rule_retired(instance)


@transaction.atomic
def _evaluate_rule(rule: AlertRule, observed: dict[str, Observation], now: datetime,
                   silences: list[Silence]) -> dict[str, int]:
    counts: dict[str, int] = defaultdict(int)
    open_alerts = {a.subject: a for a in Alert.objects.select_related("rule", "pool", "node", "team")
                   .filter(rule=rule, state__in=Alert.OPEN_STATES)}
    new = []
    for subject, obs in observed.items():
        if not rule.holds(obs.value):
            continue
        alert = open_alerts.pop(subject, None)
        if alert is None:
            new.append(Alert(rule=rule, subject=subject, subject_label=obs.label[:255], pool_id=obs.pool_id,
                             node_id=obs.node_id, team_id=obs.team_id, value=obs.value, active_since=now))
            continue
        Alert.objects.filter(pk=alert.pk).update(value=obs.value, updated_at=now)
        alert.value = obs.value
        if alert.state == Alert.State.PENDING and now - alert.active_since >= timedelta(seconds=rule.for_seconds):
            if _transition(alert, Alert.State.PENDING, Alert.State.FIRING, fired_at=now):
                counts["fired"] += 1
                counts["mails"] += _notify(alert, "firing", now, silences)
        elif alert.state == Alert.State.FIRING and not alert.notified_firing:
            # It fired while silenced: the first evaluation after the silence ends tells (as Alertmanager does).
            counts["mails"] += _notify(alert, "firing", now, silences,
                                       claim={"state": Alert.State.FIRING, "notified_firing": False})
        elif (alert.state == Alert.State.FIRING and rule.repeat_seconds and alert.last_notified_at
              and now - alert.last_notified_at >= timedelta(seconds=rule.repeat_seconds)):
            counts["mails"] += _notify(alert, "firing", now, silences, repeat=True,
                                       claim={"state": Alert.State.FIRING, "last_notified_at": alert.last_notified_at})
    if new:
        Alert.objects.bulk_create(new, ignore_conflicts=True)
        counts["pending"] += len(new)
        if rule.for_seconds == 0:
            for alert in Alert.objects.select_related("rule", "pool", "node", "team").filter(
                    rule=rule, state=Alert.State.PENDING, subject__in=[a.subject for a in new]):
                if _transition(alert, Alert.State.PENDING, Alert.State.FIRING, fired_at=now):
                    counts["fired"] += 1
                    counts["mails"] += _notify(alert, "firing", now, silences)
    for alert in open_alerts.values():  # condition no longer holds, or no data any more
        if alert.state == Alert.State.PENDING:
            Alert.objects.filter(pk=alert.pk, state=Alert.State.PENDING).delete()
        elif _transition(alert, Alert.State.FIRING, Alert.State.RESOLVED, resolved_at=now):
            counts["resolved"] += 1
            if alert.notified_firing:
                counts["mails"] += _notify(alert, "resolved", now, silences)
    return counts


def _transition(alert: Alert, from_state: str, to_state: str, **fields) -> bool:
    """Claim the transition: only the evaluation whose UPDATE changed the row acts on it."""
    changed = Alert.objects.filter(pk=alert.pk, state=from_state).update(state=to_state, **fields)
    if changed:
        alert.state = to_state
        for key, value in fields.items():
            setattr(alert, key, value)
        _push(alert)
    return bool(changed)


def _push(alert: Alert) -> None:
    payload = {"type": "alert.changed", "alert": {"id": alert.pk, "rule": alert.rule.name, "subject": alert.subject_label,
                                                  "state": alert.state, "value": round(alert.value, 2),
                                                  "severity": alert.rule.severity}}
    groups = {}
    for kind, key in (("pool", alert.pool_id), ("node", alert.node_id), ("team", alert.team_id)):
        if key is not None:
            groups[live.group_name(kind, key)] = payload
    live.send(groups)


def _silenced(alert: Alert, silences: list[Silence]) -> bool:
    return any(s.matches(alert) for s in silences)


def _notify(alert: Alert, kind: str, now: datetime, silences: list[Silence], repeat: bool = False,
            claim: dict | None = None) -> int:
    """Queue one mail about the alert (after commit). Returns 1 if it will go, 0 if silenced, claimed by
    another evaluation or nobody to tell.

    A mail that follows a claimed transition (firing, resolved) is this evaluation's alone. One that no
    transition claims (a repeat, or the firing mail a silence held back) is due to every evaluation that
    read the row, so `claim` is what the row said then: like _transition, only the evaluation whose
    conditional UPDATE still matches it sends.
    """
    if _silenced(alert, silences):
        log.info("alert %s %s silenced", alert, kind)
        return 0
    fields = {"last_notified_at": now, "notifications": alert.notifications + 1}
    if kind == "firing":
        fields["notified_firing"] = True
    changed = Alert.objects.filter(pk=alert.pk, **(claim or {})).update(**fields)
    if claim and not changed:
        return 0  # another evaluation sent it, or resolved the alert
    for key, value in fields.items():
        setattr(alert, key, value)
    _announce(alert, kind)
    to = recipients(alert)
    if not to:
        log.warning("alert %s %s: nobody to mail", alert, kind)
        return 0
    _mail(alert, kind, to, repeat)
    return 1


def affected_teams(alert: Alert) -> set[int]:
    """The alert's team, or the teams holding GPUs of its pool or node now."""
    if alert.team_id is not None:
        return {alert.team_id}
    if alert.pool_id is None and alert.node_id is None:
        return set()
    held = Allocation.objects.filter(starts_at__lte=timezone.now(), ends_at__gt=timezone.now())
    held = held.filter(gpu__pool_id=alert.pool_id) if alert.pool_id is not None else held.filter(
        gpu__node_id=alert.node_id)
    return set(held.values_list("reservation__team_id", flat=True))


def _announce(alert: Alert, kind: str) -> None:
    """To the notification channels of the teams it concerns (if the rule tells teams) and of staff (if it
    tells staff): teams/notify.py sends them after the commit."""
    rule = alert.rule
    teams = affected_teams(alert) if (rule.notify_team_managers or rule.notify_team_members) else set()
    staff = (get_user_model().objects.filter(is_staff=True, is_active=True).values_list("pk", flat=True)
             if rule.notify_staff else [])
    state = "resolved" if kind == "resolved" else "firing"
    # Put in words per channel, in its language (teams.notify.channel_language: a person's in theirs, a
    # team's in the portal's).
    notify(event=f"alert.{state}", subject=lambda: mail_subject(alert, kind),
           text=lambda: _("%(condition)s; value %(value)s.") % {"condition": condition(rule),
                                                                  "value": number_format(alert.value, 1)},
           link=alert_link(alert), data={"alert": alert.pk, "rule": rule.name, "severity": rule.severity},
           team_ids=teams, user_ids=staff)


def _number(value: float) -> str:
    """A threshold as people write it (95, 0.5), in the current language's number format."""
    return number_format(int(value) if float(value).is_integer() else value)


def condition(rule: AlertRule) -> str:
    """The rule's condition in the current language: "GPU utilization (%) >= 95"."""
    return _("%(metric)s %(comparison)s %(threshold)s") % {
        "metric": rule.get_metric_display(), "comparison": rule.comparison, "threshold": _number(rule.threshold)}


def mail_subject(alert: Alert, kind: str) -> str:
    """Alertmanager's subject shape, which people's mail filters already know: the bracketed state and
    severity stay these English codes in every language; the rule's name is the reader's."""
    state = "RESOLVED" if kind == "resolved" else "FIRING"
    return f"[{state} {alert.rule.severity}] {alert.rule.display_name}: {alert.subject_label}"


def recipients(alert: Alert) -> list[str]:
    rule = alert.rule
    teams = affected_teams(alert)
    emails: set[str] = set()
    if teams and (rule.notify_team_managers or rule.notify_team_members):
        members = Membership.objects.filter(team_id__in=teams, user__is_active=True).exclude(user__email="")
        if not rule.notify_team_members:
            members = members.filter(role=Membership.Role.MANAGER)
        emails.update(members.values_list("user__email", flat=True))
    if rule.notify_staff:
        emails.update(get_user_model().objects.filter(is_staff=True, is_active=True).exclude(email="")
                      .values_list("email", flat=True))
    emails.update(rule.extra_email_list())
    return sorted(emails)


def alert_link(alert: Alert) -> str:
    if alert.pool_id is not None:
        path = reverse("monitoring:pool", args=[alert.pool.slug])
    elif alert.node_id is not None:
        path = reverse("monitoring:node", args=[alert.node_id])
    elif alert.team_id is not None:
        path = reverse("team", args=[alert.team.slug])
    else:
        path = reverse("dashboard")
    return settings.PORTAL_BASE_URL + path


def _readers(to: list[str]) -> list[tuple[object | None, list[str]]]:
    """The addresses grouped by how their readers are spoken to (language and time zone, as each saved it;
    an address no account has gets the portal's defaults): one mail per group, each in its readers' words."""
    accounts: dict[str, object] = {}
    for user in get_user_model().objects.filter(email__in=to, is_active=True).order_by("pk"):
        accounts.setdefault(user.email, user)
    groups: dict[tuple[str, str], tuple[object | None, list[str]]] = {}
    for address in to:
        user = accounts.get(address)
        with speaking_to(user):
            key = (translation.get_language(), timezone.get_current_timezone_name())
        groups.setdefault(key, (user, []))[1].append(address)
    return list(groups.values())


def _mail(alert: Alert, kind: str, to: list[str], repeat: bool) -> None:
    rule = alert.rule
    for reader, addresses in _readers(to):
        with speaking_to(reader):
            context = {"alert": alert, "rule": rule, "kind": kind, "repeat": repeat, "link": alert_link(alert),
                       "rule_name": rule.display_name, "condition": condition(rule),
                       "value": number_format(alert.value, 1)}
            mail_after_commit(to=addresses, subject=mail_subject(alert, kind), template="monitoring/email/alert",
                              context=context, about=f"alert {alert}")
