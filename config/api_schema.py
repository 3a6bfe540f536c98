"""What the OpenAPI schema says that drf-spectacular cannot infer from the views."""
from __future__ import annotations

from typing import Any

ERROR = {
    "type": "object",
    "description": "Every refusal (config.exception_handler): a summary and each field with the rule it broke.",
    "properties": {
        "detail": {"type": "string"},
        "errors": {"type": "array", "items": {
            "type": "object",
            "properties": {"field": {"type": "string"}, "rule": {"type": "string"}, "message": {"type": "string"}},
            "required": ["field", "rule", "message"],
        }},
    },
    "required": ["detail", "errors"],
}


def declare_error_responses(result: dict[str, Any], generator, request, public) -> dict[str, Any]:
    """A drf-spectacular postprocessing hook: every operation may answer a 4xx in the one error shape
    (400 invalid input, 401, 403, 404, 409 the state refuses it, 413, 429), which the views do not
    declare one by one."""
    result.setdefault("components", {}).setdefault("schemas", {})["Error"] = ERROR
    refusal = {"description": "Refused: the body names each field and the rule it broke.",
               "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}}
    for operations in result.get("paths", {}).values():
        for operation in operations.values():
            operation.setdefault("responses", {}).setdefault("4XX", refusal)
    return result
