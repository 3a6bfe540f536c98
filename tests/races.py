"""Two writers held together just past their duplicate check: how the race tests make a race happen every time."""
from __future__ import annotations

import threading

from django.db import connection
from django.db.models.query import QuerySet

from tests.conftest import _require_postgresql


def race_past_the_check(monkeypatch, model, write) -> list[str]:
    """Run `write` twice at once, each held just after its `exists()` check on `model` (2 s at most), so
    both check before either writes unless the service serializes them; returns the two outcomes."""
    _require_postgresql()
    barrier = threading.Barrier(2)
    exists = QuerySet.exists

    def exists_then_wait(self):
        found = exists(self)
        if self.model is model:
            try:
                barrier.wait(timeout=2)
            except threading.BrokenBarrierError:
                pass
        return found

    monkeypatch.setattr(QuerySet, "exists", exists_then_wait)
    outcomes: list[str] = []

    def run() -> None:
        try:
            write()
            outcomes.append("written")
        except Exception as exc:  # noqa: BLE001 - the outcome is what the test compares
            outcomes.append(type(exc).__name__)
        finally:
            connection.close()

    threads = [threading.Thread(target=run) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return sorted(outcomes)
