"""Time zone names as people and browsers give them."""
from __future__ import annotations

import zoneinfo


def zone_named(name: str) -> zoneinfo.ZoneInfo | None:
    """The IANA zone `name` names ("Asia/Shanghai"), or None for an empty, unknown or malformed name."""
    if not name or len(name) > 64:
        return None
    try:
        return zoneinfo.ZoneInfo(name)
    except (zoneinfo.ZoneInfoNotFoundError, ValueError):  # unknown, or not a zone name ("../etc")
        return None
