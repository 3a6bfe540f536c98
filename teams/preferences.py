"""Speaking to one person outside a request (emails, notifications): in their saved language and zone.

A request has its language and zone chosen by the middleware (portal/preferences.py); a Celery task or a
service writing to someone has no request, so it asks here. Nothing saved: the portal's defaults
(LANGUAGE_CODE, TIME_ZONE).
"""
from __future__ import annotations

import zoneinfo
from collections.abc import Iterator
from contextlib import contextmanager

from django.conf import settings
from django.utils import timezone, translation

from common.zones import zone_named
from teams.selectors import preference_of


@contextmanager
def speaking_to(user) -> Iterator[None]:
    """Within the block, gettext and localtime use `user`'s language and zone (or the defaults)."""
    saved = preference_of(user)
    language = (saved.language if saved else "") or settings.LANGUAGE_CODE
    zone = zone_named(saved.time_zone if saved else "") or zoneinfo.ZoneInfo(settings.TIME_ZONE)
    with translation.override(language), timezone.override(zone):
        yield
