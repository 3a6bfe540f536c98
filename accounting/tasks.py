"""Periodic ledger work (beat schedules it: config/celery.py)."""
from __future__ import annotations

from celery import shared_task

from accounting.ledger import ledger_close
from accounting.services import statements_close_due


@shared_task(name="accounting.tasks.close_usage_hours")
def close_usage_hours() -> dict:
    """Close the hours due into the ledger, then freeze the statements of each month now wholly final."""
    out = ledger_close()
    out["statements"] = statements_close_due()
    return out
