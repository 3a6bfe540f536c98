"""Periodic telemetry work: rollups and pruning, and alert evaluation (beat schedules both)."""
from __future__ import annotations

from celery import shared_task

from monitoring.alerts import alerts_evaluate
from monitoring.rollup import telemetry_rollup


@shared_task(name="monitoring.tasks.rollup_telemetry")
def rollup_telemetry() -> dict:
    return telemetry_rollup()


@shared_task(name="monitoring.tasks.evaluate_alerts")
def evaluate_alerts() -> dict:
    return alerts_evaluate()
