"""Small DRF pieces shared by the apps' APIs."""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from django.core.exceptions import ValidationError as DjangoValidationError
from django.db import models
from django.utils.translation import gettext as _
from rest_framework import parsers, permissions, serializers
from rest_framework.exceptions import ParseError
from rest_framework.pagination import LimitOffsetPagination

from common.errors import FieldError, ValidationFailed


def _has_nul(value: Any) -> bool:
    """Whether a NUL character is in any string of a decoded JSON value (keys too); iterative, as
    nesting is the sender's choice."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            if "\x00" in item:
                return True
        elif isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return False


class NulFreeJSONField(serializers.JSONField):
    """JSONField that refuses a NUL character anywhere in the value: PostgreSQL's jsonb refuses
    \u0000 outright (a DataError at save, a 500), where DRF's CharField already refuses it."""

    default_error_messages = {"null_characters_not_allowed": "Null characters are not allowed."}

    def to_internal_value(self, data: Any) -> Any:
        value = super().to_internal_value(data)
        if _has_nul(value):
            self.fail("null_characters_not_allowed")
        return value


class RefusesUnknownFields:
    """A serializer mixin: a body naming a field the serializer does not have is refused (400, rule
    `unknown_field`, naming each such field) instead of being dropped in silence, so a misspelt
    `wieght` is not a successful no-op. Read-only fields are known (a client may send back what it
    read); a browser form's CSRF token is not a field of the resource. A script that sends
    `mig_profile` to an endpoint that does not take it must learn so, not get a whole GPU."""

    IGNORED_KEYS = frozenset({"csrfmiddlewaretoken"})

    def to_internal_value(self, data):
        if isinstance(data, Mapping):
            unknown = sorted(str(key) for key in data if key not in self.fields and key not in self.IGNORED_KEYS)
            if unknown:
                raise serializers.ValidationError({
                    name: [serializers.ErrorDetail(
                        f"Unknown field {name!r}: this endpoint takes "
                        f"{', '.join(sorted(n for n, f in self.fields.items() if not f.read_only))}.",
                        code="unknown_field")]
                    for name in unknown})
        return super().to_internal_value(data)


class CleanModelSerializer(serializers.ModelSerializer):
    """Runs the model's own clean() on the would-be instance, so single-row rules live in one place."""

    serializer_field_mapping = {**serializers.ModelSerializer.serializer_field_mapping,
                                models.JSONField: NulFreeJSONField}

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        attrs = super().validate(attrs)
        model = self.Meta.model
        instance = self.instance or model()
        for name, value in attrs.items():
            field = model._meta.get_field(name)
            if not (field.many_to_many or field.one_to_many):
                setattr(instance, name, value)
        try:
            instance.clean()
        except DjangoValidationError as exc:
            detail = exc.message_dict if hasattr(exc, "error_dict") else {"non_field_errors": exc.messages}
            raise serializers.ValidationError(detail) from exc
        return attrs


class SlugLookupField(serializers.SlugRelatedField):
    """SlugRelatedField that refuses a NUL byte as `invalid` before it looks the row up: PostgreSQL
    refuses NUL in text outright (a DataError, which DRF's field does not catch: a 500)."""

    def to_internal_value(self, data: Any) -> Any:
        if isinstance(data, str) and "\x00" in data:
            self.fail("invalid")
        return super().to_internal_value(data)


class JSONParser(parsers.JSONParser):
    """DRF's JSON parser, but a body nested deeper than Python's json module recurses (100,000 '[')
    is a 400 malformed body like any other bad JSON: json.loads raises RecursionError, not the
    ValueError DRF's parser turns into a ParseError, so it was a 500."""

    def parse(self, stream, media_type=None, parser_context=None):
        try:
            return super().parse(stream, media_type, parser_context)
        except RecursionError:
            raise ParseError("JSON parse error - nested too deeply") from None


class IsStaffOrReadOnly(permissions.BasePermission):
    """Anyone signed in reads (what the queryset lets them see); only staff write."""

    def has_permission(self, request, view) -> bool:
        if not (request.user and request.user.is_authenticated):
            return False
        return request.method in permissions.SAFE_METHODS or request.user.is_staff


class Pagination(LimitOffsetPagination):
    """limit/offset paging with bounds: a huge number must not reach the database as an integer overflow."""

    default_limit = 100
    max_limit = 1000
    max_offset = 2**31 - 1

    count_of = None  # what get_count counts instead of the paged queryset (see paginate_rows)

    def get_offset(self, request) -> int:
        return min(super().get_offset(request), self.max_offset)

    def paginate_rows(self, rows, request, view=None, *, count_of):
        """Page `rows` (e.g. a values_list of joined columns), counting `count_of`, the same filter
        over the bare table: the count then needs none of the joins the page's columns bring (for a
        team with 200,000 reservations: 44 -> 25 ms)."""
        self.count_of = count_of
        return self.paginate_queryset(rows, request, view)

    def get_count(self, queryset) -> int:
        return super().get_count(queryset if self.count_of is None else self.count_of)


class RefusesUnknownQueryParameters:
    """A list view mixin: a query parameter that is neither one of its filters nor paging is refused (400,
    rule `unknown_field`) instead of being ignored, where a misspelt filter (`?actr=alice`) would
    answer the whole, unfiltered list as if it were the answer."""

    def known_query_parameters(self) -> set[str]:
        known = {"format"}
        filterset_class = getattr(self, "filterset_class", None)
        if filterset_class is not None:
            known |= set(filterset_class.base_filters)
        paginator = getattr(self, "paginator", None)
        if paginator is not None:
            known |= {getattr(paginator, name) for name in ("limit_query_param", "offset_query_param")
                      if getattr(paginator, name, None)}
        return known

    def initial(self, request, *args, **kwargs):
        super().initial(request, *args, **kwargs)
        known = self.known_query_parameters()
        unknown = sorted(name for name in request.query_params if name not in known)
        if unknown:
            raise ValidationFailed(
                _("Unknown query parameter %(name)s: this endpoint takes %(known)s.") % {
                    "name": repr(unknown[0]), "known": ", ".join(sorted(known))},
                errors=[FieldError(field=name, rule="unknown_field",
                                   message=_("Unknown query parameter %(name)s.") % {"name": repr(name)})
                        for name in unknown])
