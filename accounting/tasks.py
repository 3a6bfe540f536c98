"""Periodic ledger work (beat schedules it: config/celery.py)."""
from __future__ import annotations

from celery import shared_task

from accounting.ledger import ledger_close


@shared_task(name="accounting.tasks.close_usage_hours")
def close_usage_hours() -> dict:
    return ledger_close()
