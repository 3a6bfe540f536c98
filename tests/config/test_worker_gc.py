"""The worker freezes what it has loaded once it is up (config/celery.py), as the web process does."""

from __future__ import annotations

import gc

from celery.signals import worker_ready

from config.celery import freeze_what_is_loaded


def test_the_worker_freezes_what_it_has_loaded_once_it_is_ready() -> None:
    gc.unfreeze()
    assert gc.get_freeze_count() == 0
    try:
        worker_ready.send(sender=object())
        # Everything this test process has loaded (Django, the apps, the task modules) is out of the collector's
        # sight now: its full collections scan only what is made after.
        assert gc.get_freeze_count() > 50_000
    finally:
        gc.unfreeze()
