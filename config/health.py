"""/healthz (the process answers), /readyz (database and broker reachable)."""
from __future__ import annotations

from django.db import connection
from django.http import HttpRequest, JsonResponse

from config.celery import app as celery_app


def healthz(request: HttpRequest) -> JsonResponse:
    return JsonResponse({"status": "ok"})


def _database_ok() -> str | None:
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
            cursor.fetchone()
    except Exception as exc:  # any failure means "not ready"; say which
        return f"{type(exc).__name__}: {exc}"
    return None


def _broker_ok() -> str | None:
    try:
        with celery_app.connection_for_write() as conn:
            conn.ensure_connection(max_retries=1, timeout=2)
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"
    return None


def readyz(request: HttpRequest) -> JsonResponse:
    problems = {name: error for name, error in (("database", _database_ok()), ("broker", _broker_ok())) if error}
    body = {"status": "ok" if not problems else "unavailable",
            "database": problems.get("database", "ok"), "broker": problems.get("broker", "ok")}
    return JsonResponse(body, status=200 if not problems else 503)
