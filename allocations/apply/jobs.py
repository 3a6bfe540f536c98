"""Apply jobs: the lifecycle between a reservation's state and what its cluster enforces.

    scheduled ──activate──▶ applying ──apply job ok──▶ active
                               │ rejected / deadline        │ release or window end
                               ▼                            ▼
                             failed                    releasing ──undo job ok──▶ released | expired

A job is claimed with a conditional update (queued, or retrying and due → running), runs
one level-triggered sync of the cluster for the reservation's team, and ends succeeded,
retrying (remote error: exponential backoff with a cap) or failed (the cluster refused,
or the deadline passed). Every outcome is written to the job row, which the reservation
page and the API show.

Nothing stays in applying forever because the sweep re-drives what the messages did not:

- a queued job whose message has not started it after APPLY_LOST_MESSAGE_SECONDS (the message
  was lost, e.g. with a broker that went away without saving), and a retry whose time has come;
- a running job whose worker died. A claim is a lease (`lease_until`): the attempt renews it
  every third of APPLY_JOB_LEASE_SECONDS from a thread of its own while the sync runs, so a
  slow cluster keeps it; once it lapses the sweep puts the job back to retrying, and the next
  claim starts a new attempt. The attempt number is the claim's token: an attempt writes its
  outcome only while the job is still running that attempt, so the outcome of a worker that
  was only slow (its lease lapsed while it could not reach the database) is dropped rather
  than mixed with the next attempt's. Syncs are idempotent, so two syncs that overlap in such
  a case do no harm; only one of them is recorded.
"""
from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime, timedelta

from django.conf import settings
from django.db import connection, transaction
from django.db.models import F, Q
from django.utils import timezone
from django.utils.translation import gettext_noop

from allocations import notices, queue
from allocations.messages import Msg, in_english, stored_reason
from allocations.apply.backends import BackendError, BackendRejected, backend_for, backend_name
from allocations.apply.selectors import cluster_desired
from allocations.models import ApplyJob, HostLeaseReport, Reservation
from common.dispatch import enqueue_after_commit
from allocations.transitions import move
from common.errors import instant
from inventory.models import Cluster

log = logging.getLogger(__name__)

Job = ApplyJob
Status = ApplyJob.Status
State = Reservation.State

# A running job without a lease (claimed before leases existed) is taken back this long after its deadline.
STALE_RUNNING_GRACE = timedelta(minutes=2)


def lease_length() -> timedelta:
    return timedelta(seconds=settings.APPLY_JOB_LEASE_SECONDS)


def retry_delay(attempts: int) -> float:
    """Seconds before attempt `attempts + 1`: base * 2^(attempts-1), capped."""
    return min(settings.APPLY_RETRY_CAP_SECONDS, settings.APPLY_RETRY_BASE_SECONDS * 2 ** max(0, attempts - 1))


def _enqueue(job_id: int, countdown: float = 0.0) -> None:
    enqueue_after_commit("allocations.tasks.run_apply_job", job_id, countdown=countdown)


def _clusters_of(reservation: Reservation) -> list[Cluster]:
    return list(Cluster.objects.filter(nodes__gpus__allocations__reservation=reservation).distinct().order_by("pk"))


def _target(cluster: Cluster, reservation: Reservation) -> str:
    from allocations.apply.desired import team_namespace

    if cluster.kind == Cluster.Kind.KUBERNETES:
        return f"Kubernetes cluster {cluster.slug}, namespace {team_namespace(reservation.team.slug)}"
    hosts = sorted(set(reservation.allocations.filter(gpu__node__cluster=cluster)
                       .values_list("gpu__node__name", flat=True)))
    return f"hosts {', '.join(hosts)} of {cluster.slug} (agent leases)"


def jobs_create(*, reservation: Reservation, action: str, final_state: str = "",
                now: datetime | None = None) -> list[ApplyJob]:
    """Queue one job per cluster the reservation touches (inside the caller's transaction)."""
    now = now or timezone.now()
    jobs = []
    for cluster in _clusters_of(reservation):
        job = ApplyJob.objects.create(
            reservation=reservation, cluster=cluster, action=action, final_state=final_state,
            backend=backend_name(cluster), target=_target(cluster, reservation), deadline=now + settings.APPLY_DEADLINE,
        )
        _enqueue(job.pk)
        jobs.append(job)
    return jobs


def _claim(job_id: int, now: datetime) -> ApplyJob | None:
    due = Q(status=Status.QUEUED) | Q(status=Status.RETRYING, next_attempt_at__lte=now)
    claimed = ApplyJob.objects.filter(due, pk=job_id).update(
        status=Status.RUNNING, attempts=F("attempts") + 1, started_at=now, next_attempt_at=None,
        lease_until=now + lease_length(),
    )
    if not claimed:
        return None
    return ApplyJob.objects.select_related("cluster", "reservation__team").get(pk=job_id)


def _this_attempt(job: ApplyJob):
    """The job's row while it still runs `job`'s attempt: every write of an outcome goes through it."""
    return ApplyJob.objects.filter(pk=job.pk, status=Status.RUNNING, attempts=job.attempts)


@contextmanager
def _lease_kept(job: ApplyJob) -> Iterator[None]:
    """Renew the claim's lease every third of its length until the block ends (a thread of its own,
    so a sync that blocks on a silent cluster still keeps its claim)."""
    stop = threading.Event()

    def renew() -> None:
        try:
            while not stop.wait(settings.APPLY_JOB_LEASE_SECONDS / 3):
                if not _this_attempt(job).update(lease_until=timezone.now() + lease_length()):
                    log.warning("apply job %s: attempt %s was taken back (its lease had lapsed)", job.pk,
                                job.attempts)
                    return
        except Exception:  # the database is away: the lease lapses and the sweep decides
            log.warning("apply job %s: could not renew its lease", job.pk, exc_info=True)
        finally:
            connection.close()  # this thread's own connection

    keeper = threading.Thread(target=renew, name=f"apply-job-{job.pk}-lease", daemon=True)
    keeper.start()
    try:
        yield
    finally:
        stop.set()
        keeper.join()


def job_run(*, job_id: int, now: datetime | None = None) -> str:
    """Run one attempt of a job if it is due; returns the job's status afterwards ('' if not claimed)."""
    now = now or timezone.now()
    job = _claim(job_id, now)
    if job is None:
        return ""
    reservation = job.reservation
    if reservation is not None and not _still_wanted(job, reservation):
        _finish(job, Status.SUCCEEDED, now=now, error="Nothing to do: the reservation moved on before this ran.")
        return Status.SUCCEEDED
    # The sync talks to a remote cluster: no database transaction or lock is held meanwhile.
    try:
        with _lease_kept(job):
            backend = backend_for(job.cluster)
            teams = None if reservation is None else [reservation.team.slug]
            desired = cluster_desired(job.cluster, now=now, teams=teams, with_pools=backend.reads_pools)
            report = backend.sync(desired, teams=teams)
    except BackendRejected as refused:
        return _failed(job, f"{job.cluster.slug} refused: {refused}", now=timezone.now())
    except BackendError as error:
        return _retry_or_fail(job, str(error), now=timezone.now())
    except Exception as error:  # a bug or an unexpected client error: retried like a remote error, and logged
        log.exception("apply job %s crashed", job.pk)
        return _retry_or_fail(job, f"{type(error).__name__}: {error}", now=timezone.now())
    return _succeeded(job, report.changes, now=timezone.now())


def _still_wanted(job: ApplyJob, reservation: Reservation) -> bool:
    if job.action == ApplyJob.Action.APPLY:
        return reservation.state == State.APPLYING
    return reservation.state == State.RELEASING


def _finish(job: ApplyJob, status: str, *, now: datetime, error: str = "", changes: list[str] | None = None) -> bool:
    """Record the attempt's outcome; False (nothing written) if the job was taken back from this attempt."""
    # One statement: atomic by itself, and no savepoint inside the callers' transactions.
    written = _this_attempt(job).update(status=status, finished_at=now, error=error, lease_until=None,
                                        changes=changes if changes is not None else job.changes)
    if not written:
        log.warning("apply job %s: attempt %s ended (%s) after it was taken back; its outcome is dropped",
                    job.pk, job.attempts, status)
    return bool(written)


@transaction.atomic
def _succeeded(job: ApplyJob, changes: list[str], *, now: datetime) -> str:
    if not _finish(job, Status.SUCCEEDED, now=now, changes=changes):
        return ""
    if job.reservation_id is None:
        return Status.SUCCEEDED
    reservation = Reservation.objects.select_for_update().get(pk=job.reservation_id)
    if job.action == ApplyJob.Action.APPLY and reservation.state == State.APPLYING:
        open_jobs = reservation.apply_jobs.filter(action=ApplyJob.Action.APPLY, status__in=ApplyJob.OPEN_STATUSES)
        if not open_jobs.exclude(pk=job.pk).exists():
            move(reservation, State.ACTIVE, reason=Msg(gettext_noop("Applied on %(target)s."), target=job.target))
            notices.announce(reservation, "reservation.active",
                             Msg(gettext_noop("Reservation #%(id)s is active"), id=reservation.pk),
                             Msg(gettext_noop("Its GPUs are ready on %(target)s until %(end)s."), target=job.target,
                                 end=instant(reservation.ends_at)))
    elif job.action == ApplyJob.Action.UNDO and reservation.state == State.RELEASING:
        open_jobs = reservation.apply_jobs.filter(action=ApplyJob.Action.UNDO, status__in=ApplyJob.OPEN_STATUSES)
        if not open_jobs.exclude(pk=job.pk).exists():
            move(reservation, job.final_state or State.RELEASED, reason=stored_reason(reservation), now=now)
    return Status.SUCCEEDED


@transaction.atomic
def _retry_or_fail(job: ApplyJob, error: str, *, now: datetime) -> str:
    delay = retry_delay(job.attempts)
    if now + timedelta(seconds=delay) > job.deadline:
        minutes = settings.APPLY_DEADLINE.total_seconds() / 60
        return _failed(job, Msg(gettext_noop("Not confirmed within %(minutes)s minutes; last error: %(error)s"),
                                minutes=f"{minutes:g}", error=error), now=now)
    if job.backend == "agent" and HostLeaseReport.objects.filter(
            node__cluster_id=job.cluster_id, reported_at__gte=job.started_at).exists():
        # A host answered while this attempt ran; its answer could not wake a job that was not yet
        # waiting (host_lease_report wakes retrying jobs only), so look again at once.
        delay = 0.0
    if not _this_attempt(job).update(status=Status.RETRYING, error=error, lease_until=None,
                                     next_attempt_at=now + timedelta(seconds=delay)):
        log.warning("apply job %s: attempt %s failed after it was taken back; its outcome is dropped", job.pk,
                    job.attempts)
        return ""
    _enqueue(job.pk, countdown=delay)
    return Status.RETRYING


@transaction.atomic
def _failed(job: ApplyJob, error: Msg | str, *, now: datetime) -> str:
    """`error`: the backend's own words (not translated), or a message of ours around them."""
    if not _finish(job, Status.FAILED, now=now, error=in_english(error)):
        return ""
    if job.reservation_id is None:
        return Status.FAILED
    reservation = Reservation.objects.select_for_update().get(pk=job.reservation_id)
    if job.action == ApplyJob.Action.APPLY and reservation.state == State.APPLYING:
        # Free the GPUs at once and let a reconcile remove whatever was half-applied.
        reservation.allocations.filter(starts_at__gt=now).update(starts_at=now)
        reservation.allocations.filter(ends_at__gt=now).update(ends_at=now)
        move(reservation, State.FAILED, reason=Msg(gettext_noop("Could not be applied: %(error)s"), error=error),
             now=now)
        notices.announce(reservation, "reservation.failed", Msg(gettext_noop("Reservation #%(id)s failed"),
                                                                id=reservation.pk),
                         Msg(gettext_noop("It could not be applied: %(error)s"), error=error))
        reconcile_enqueue(cluster=job.cluster, now=now)
        queue.kick(reservation.pool_id)
    elif job.action == ApplyJob.Action.UNDO and reservation.state == State.RELEASING:
        # The GPUs are already free in the portal; the reconcile keeps removing what is left.
        move(reservation, job.final_state or State.RELEASED,
             reason=Msg(gettext_noop("%(reason)s Undo not confirmed on %(cluster)s (%(error)s); the periodic "
                                     "reconcile keeps removing it."), reason=stored_reason(reservation),
                        cluster=job.cluster.slug, error=error), now=now)
        reconcile_enqueue(cluster=job.cluster, now=now)
    return Status.FAILED


# --- reconcile --------------------------------------------------------------------------------

def reconcile_enqueue(*, cluster: Cluster, now: datetime | None = None) -> ApplyJob | None:
    """Queue a reconcile of `cluster` unless one is already open (inside the caller's transaction)."""
    now = now or timezone.now()
    if ApplyJob.objects.filter(cluster=cluster, action=ApplyJob.Action.RECONCILE,
                               status__in=ApplyJob.OPEN_STATUSES).exists():
        return None
    job = ApplyJob.objects.create(
        cluster=cluster, action=ApplyJob.Action.RECONCILE, target=f"everything the portal manages on {cluster.slug}",
        backend=backend_name(cluster), deadline=now + timedelta(seconds=max(settings.RECONCILE_SECONDS, 30.0)),
    )
    _enqueue(job.pk)
    return job


def cluster_reconcile(*, cluster_id: int, now: datetime | None = None) -> dict:
    """Compare `cluster` with the database and repair drift now. Kept as a job row only when
    something was repaired or went wrong, so a quiet fleet does not fill the table."""
    now = now or timezone.now()
    cluster = Cluster.objects.get(pk=cluster_id)
    if cluster.kind == Cluster.Kind.KUBERNETES and not cluster.has_credentials:
        return {"cluster": cluster.slug, "skipped": "no credentials registered"}
    try:
        backend = backend_for(cluster)
        report = backend.sync(cluster_desired(cluster, now=now, with_pools=backend.reads_pools), teams=None)
    except BackendError as error:
        _record_failed_reconcile(cluster, str(error), now=now)
        return {"cluster": cluster.slug, "error": str(error)}
    if report.changes:
        ApplyJob.objects.create(cluster=cluster, action=ApplyJob.Action.RECONCILE, backend=backend_name(cluster),
                                target=report.target, status=Status.SUCCEEDED, attempts=1, started_at=now,
                                finished_at=timezone.now(), deadline=now, changes=report.changes)
        log.warning("reconcile of %s repaired: %s", cluster.slug, "; ".join(report.changes))
    return {"cluster": cluster.slug, "repaired": report.changes}


def _record_failed_reconcile(cluster: Cluster, error: str, *, now: datetime) -> None:
    """One row per outage, not one per beat: the same error again only counts another attempt."""
    last = ApplyJob.objects.filter(cluster=cluster, action=ApplyJob.Action.RECONCILE).order_by("-pk").first()
    if last is not None and last.status == Status.FAILED and last.error == error:
        ApplyJob.objects.filter(pk=last.pk).update(attempts=F("attempts") + 1, finished_at=timezone.now())
        return
    ApplyJob.objects.create(cluster=cluster, action=ApplyJob.Action.RECONCILE, backend=backend_name(cluster),
                            target=f"everything the portal manages on {cluster.slug}", status=Status.FAILED,
                            attempts=1, started_at=now, finished_at=timezone.now(), deadline=now, error=error)


# --- what the sweep re-drives ------------------------------------------------------------------

def jobs_take_back(now: datetime | None = None) -> int:
    """Put running jobs whose worker died (their lease lapsed) back to retrying, due now. Returns how many."""
    now = now or timezone.now()
    lapsed = Q(lease_until__lt=now) | Q(lease_until__isnull=True, deadline__lt=now - STALE_RUNNING_GRACE)
    return ApplyJob.objects.filter(lapsed, status=Status.RUNNING).update(
        status=Status.RETRYING, next_attempt_at=now, lease_until=None,
        error="The worker running this attempt stopped renewing its claim (it died or lost the database).",
    )


def jobs_due_ids(now: datetime | None = None) -> list[int]:
    """Jobs to (re)run now: retries whose time has come, queued jobs whose message was lost, and
    running jobs whose worker died (taken back first)."""
    now = now or timezone.now()
    jobs_take_back(now)
    lost_after = timedelta(seconds=settings.APPLY_LOST_MESSAGE_SECONDS)
    due = (Q(status=Status.RETRYING, next_attempt_at__lte=now)
           | Q(status=Status.QUEUED, created_at__lte=now - lost_after))
    return list(ApplyJob.objects.filter(due).order_by("pk").values_list("pk", flat=True)[:500])


def releasing_without_undo_ids() -> list[int]:
    """Reservations in releasing with no open undo job (e.g. made before apply jobs existed)."""
    open_undo = ApplyJob.objects.filter(action=ApplyJob.Action.UNDO, status__in=ApplyJob.OPEN_STATUSES)
    return list(Reservation.objects.filter(state=State.RELEASING).exclude(
        pk__in=open_undo.values("reservation_id")).values_list("pk", flat=True)[:500])
