"""Who is acting and from where, for the audit entries written while they act.

A context variable (not django-auditlog's set_actor, which connects a signal receiver per request
and does not restore an outer context when an inner one ends): the middleware sets it for a
request, the Celery signals below for a task. Nothing set means a system task (the sweep and the
workers' other loops, the embedded demo's start-up).
"""
from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from contextvars import ContextVar
from dataclasses import dataclass, field

from django.contrib.auth.base_user import AbstractBaseUser
from django.utils.translation import gettext_lazy as _


class Source:
    API = "api"
    PAGE = "page"
    ADMIN = "admin"
    SYSTEM = "system"
    choices = ((API, "API"), (PAGE, _("page")), (ADMIN, _("admin")), (SYSTEM, _("system task")))


def _nobody() -> None:
    return None


@dataclass(frozen=True)
class Acting:
    source: str
    # Called when an entry is written, not when the request starts: DRF authenticates a token in the
    # view, after the middleware, and sets the user on the request then.
    actor: Callable[[], AbstractBaseUser | None] = field(default=_nobody)
    # What acted, when no person did (a task's name).
    detail: str = ""


_acting: ContextVar[Acting] = ContextVar("audit_acting", default=Acting(source=Source.SYSTEM))


def current() -> Acting:
    return _acting.get()


@contextlib.contextmanager
def acting(source: str, *, actor: Callable[[], AbstractBaseUser | None] = _nobody, detail: str = "") -> Iterator[None]:
    token = _acting.set(Acting(source=source, actor=actor, detail=detail))
    try:
        yield
    finally:
        _acting.reset(token)


_task_tokens: dict[str, object] = {}


def _task_started(task_id: str | None = None, task=None, **_: object) -> None:
    if task_id is not None:
        _task_tokens[task_id] = _acting.set(Acting(source=Source.SYSTEM, detail=getattr(task, "name", "")))


def _task_finished(task_id: str | None = None, **_: object) -> None:
    token = _task_tokens.pop(task_id, None) if task_id is not None else None
    if token is not None:
        try:
            _acting.reset(token)
        except ValueError:  # set in another context (a task run eagerly inside another): leave it
            pass


def connect_celery_signals() -> None:
    """A task acts as the system whatever enqueued it, and its entries name the task."""
    from celery.signals import task_postrun, task_prerun

    task_prerun.connect(_task_started, dispatch_uid="audit-task-started", weak=False)
    task_postrun.connect(_task_finished, dispatch_uid="audit-task-finished", weak=False)
