"""How the audit page writes an entry's changed fields."""
from __future__ import annotations

import json
from typing import Any

from django import template

register = template.Library()


def _shown(value: Any) -> str:
    if value is None or value == "":
        return "—"
    if isinstance(value, (dict, list)):
        return json.dumps(value, sort_keys=True)
    return str(value)


@register.filter
def changed_fields(changes: Any) -> list[tuple[str, str, str]]:
    """[(field, before, after)] from an entry's {field: [before, after]}; other shapes as they are."""
    if not isinstance(changes, dict):
        return []
    rows = []
    for name, value in changes.items():
        if isinstance(value, list) and len(value) == 2:
            rows.append((name, _shown(value[0]), _shown(value[1])))
        else:
            rows.append((name, "", _shown(value)))
    return rows
