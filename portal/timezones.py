"""The time zone the pages show times in, and times as people read them.

The browser names its IANA zone in the `tz` cookie (static/js/timezone.js); the middleware activates
it for the request, so templates, messages and forms (a naive "2026-11-24 18:30" posted by the reserve
form is that zone's 18:30) all use it. A missing or unknown zone falls back to settings.TIME_ZONE.
`zone_for` is the one place the choice is made; a saved preference (portal/preferences.py) comes first.
"""
from __future__ import annotations

import re
import zoneinfo
from datetime import datetime, tzinfo

from django.conf import settings
from django.utils import formats, timezone
from django.utils.translation import pgettext

from common.zones import zone_named

TZ_COOKIE = "tz"
API_PREFIX = "/api/"
# People's format, 24-hour, with the zone: "Tue 24 Nov 18:30 CST"; the year only when it is not this one.
# These are the English ones; each language gives its own through the catalogue (`when_format`), e.g.
# zh-Hans "n月j日 D H:i T". Whatever the language, a format ends with " T" (the zone) and holds "H:i".
WHEN_FORMAT = "D j M H:i T"
WHEN_FORMAT_WITH_YEAR = "D j M Y H:i T"
# What the reserve and extend forms show and read: 24-hour, in the page's zone.
INPUT_FORMAT = "%Y-%m-%d %H:%M"
# An instant as the services write it in messages and history (ISO 8601 with an offset).
# Not \b before it: in Chinese text ("截止2026-…") a digit right after a CJK letter is no word boundary
# (\w is Unicode); an ASCII letter or digit before it still is not an instant.
ISO_INSTANT = re.compile(r"(?<![0-9A-Za-z_])\d{4}-\d{2}-\d{2}T\d{2}:\d{2}(?::\d{2}(?:\.\d+)?)?(?:Z|[+-]\d{2}:\d{2})")


def zone_for(request) -> tzinfo:
    """The zone `request`'s pages use: the signed-in person's saved zone, else the browser's (cookie),
    else the portal's default."""
    saved = getattr(getattr(request, "preference", None), "time_zone", "")
    return (zone_named(saved) or zone_named(request.COOKIES.get(TZ_COOKIE, ""))
            or zoneinfo.ZoneInfo(settings.TIME_ZONE))


class TimezoneMiddleware:
    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        if request.path.startswith(API_PREFIX):
            # The API's contract is ISO 8601 in the portal's zone whoever calls it: a browser's cookie
            # must not change how a script's naive time is read or how instants are written back.
            return self.get_response(request)
        timezone.activate(zone_for(request))
        try:
            return self.get_response(request)
        finally:
            timezone.deactivate()


def when_format(*, with_year: bool = False) -> str:
    """The active language's format of an instant (Django's date format letters)."""
    if with_year:
        # Translators: Django date format letters of an instant with its year (D weekday, j day, M month,
        # Y year, H:i 24-hour time, T zone). Keep "H:i" and end with " T".
        return pgettext("date format", "D j M Y H:i T")
    # Translators: Django date format letters of an instant this year (D weekday, j day, M month, H:i 24-hour
    # time, T zone). Keep "H:i" and end with " T".
    return pgettext("date format", "D j M H:i T")


def _pattern(local: datetime, *, seconds: bool = False, zone: bool = True) -> str:
    pattern = when_format(with_year=local.year != timezone.localtime().year)
    if seconds:
        pattern = pattern.replace("H:i", "H:i:s")
    return pattern if zone else pattern.removesuffix(" T")


def when(value: datetime | None, *, seconds: bool = False) -> str:
    """An instant in the active zone as people read it: "Tue 24 Nov 18:30 CST" ("…18:30:05 CST")."""
    if value is None:
        return ""
    local = timezone.localtime(value)
    return formats.date_format(local, _pattern(local, seconds=seconds))


def window(start: datetime, end: datetime) -> str:
    """A window as people read it: "Tue 24 Nov 18:30 → 20:30 CST" within a day, else both ends in full."""
    local_start, local_end = timezone.localtime(start), timezone.localtime(end)
    if local_start.date() == local_end.date() and local_start.tzname() == local_end.tzname():
        return pgettext("time window", "%(start)s → %(end)s") % {
            "start": formats.date_format(local_start, _pattern(local_start, zone=False)),
            "end": formats.date_format(local_end, "H:i T")}
    return pgettext("time window", "%(start)s → %(end)s") % {"start": when(start), "end": when(end)}


def people_times(text: str) -> str:
    """`text` (a service's message or a history reason) with each ISO instant written as `when` writes it."""
    def replace(match: re.Match) -> str:
        try:
            return when(datetime.fromisoformat(match.group(0).replace("Z", "+00:00")))
        except ValueError:
            return match.group(0)
    return ISO_INSTANT.sub(replace, text or "")


def zone_label() -> str:
    """The active zone as a page names it: "Asia/Shanghai (CST)", "UTC"."""
    zone = timezone.get_current_timezone()
    name = str(getattr(zone, "key", zone))
    short = timezone.localtime().tzname()
    if short in (None, name):
        return name
    # Translators: a time zone's IANA name and its abbreviation, "Asia/Shanghai (CST)".
    return pgettext("zone label", "%(name)s (%(short)s)") % {"name": name, "short": short}
