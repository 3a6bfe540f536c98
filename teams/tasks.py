"""Sending notifications to channels (teams/notify.py): thin tasks, the Delivery rows are the truth."""
from __future__ import annotations

from celery import shared_task

from common.dispatch import enqueue
from teams import notify


@shared_task(ignore_result=True)
def deliver(delivery_id: int) -> str | None:
    return notify.delivery_attempt(delivery_id)


@shared_task(ignore_result=True)
def deliveries_due() -> int:
    """Queue every delivery due now: retries after their wait, and any whose task was lost."""
    due = notify.due_deliveries()
    for delivery_id in due:
        enqueue("teams.tasks.deliver", delivery_id)
    return len(due)
