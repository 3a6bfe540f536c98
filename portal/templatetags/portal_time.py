"""Times as the pages show them (portal.timezones): `{{ dt|when }}`, `{{ dt|when_s }}` with seconds,
`{{ text|people_times }}` for a message or a reason that names instants, `{% zone_label %}`."""
from __future__ import annotations

from django import template

from portal import timezones

register = template.Library()


@register.filter
def when(value) -> str:
    return timezones.when(value)


@register.filter
def when_s(value) -> str:
    return timezones.when(value, seconds=True)


@register.filter
def window_to(start, end) -> str:
    """`{{ start|window_to:end }}`: "Tue 24 Nov 18:30 → 20:30 CST"."""
    return timezones.window(start, end)


@register.filter
def people_times(text) -> str:
    return timezones.people_times(str(text or ""))


@register.simple_tag
def zone_label() -> str:
    return timezones.zone_label()
