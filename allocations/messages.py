"""Text for people that is stored: written once, read in each reader's language.

A reservation's `reason` and `preempt_reason`, a queue entry's `reason_text` and `moved_why`, and a
history event's `reason` are decided by a service or a task (often with no request, so in no reader's
language) and read later by anyone. Each is stored twice: the column keeps the English sentence, as
before (the audit log, SQL readers, scripts and old clients see what they always saw), and a JSON
column beside it keeps what it was made of, a `Msg`: the untranslated message (marked with
gettext_noop, so it is in the catalogue) and its named arguments, which may be messages themselves.
Reading the attribute on a model (`reservation.reason`, what the pages, the API's serializers and
the emails read) renders the message in the active language; a row without one (written before
the JSON column, or written as plain text by hand) is shown as written, and so is a row whose
English column no longer matches its message (edited by someone who did not write the message).
"""
from __future__ import annotations

import json
from typing import Any

from django.db import models
from django.db.models.query_utils import DeferredAttribute
from django.utils import translation
from django.utils.translation import gettext, gettext_noop, ngettext


class Msg:
    """A message for people and its arguments, rendered when read: `str(msg)` in the active language,
    `msg.english()` as stored in the text column, `msg.data()` as stored in the JSON column.

    `Msg(gettext_noop("Released early by %(who)s."), who="ana")`; a plural names its count's argument:
    `Msg.plural(gettext_noop("%(n)d GPU"), gettext_noop("%(n)d GPUs"), "n", n=2)`. Arguments are plain
    values (kept as given: names, numbers, ISO instants) or Msgs (translated with the rest)."""

    __slots__ = ("id", "plural_id", "count_arg", "args", "en")

    def __init__(self, msgid: str, /, **args: Any) -> None:
        self.id = msgid
        self.plural_id = ""
        self.count_arg = ""
        self.args = args
        self.en: str | None = None

    @classmethod
    def summary(cls, msgid: str, english: str, /, **args: Any) -> "Msg":
        """`english` (a detailed sentence from code that does not translate, e.g. the placement engine's),
        read as `msgid` (a translated summary of it) in a language that has a translation."""
        msg = cls(msgid, **args)
        msg.en = english
        return msg

    @classmethod
    def plural(cls, singular: str, plural: str, count_arg: str, /, **args: Any) -> "Msg":
        msg = cls(singular, **args)
        msg.plural_id, msg.count_arg = plural, count_arg
        return msg

    @classmethod
    def verbatim(cls, text: str) -> "Msg":
        """Text that is not ours to translate (a cluster's error, a node's health reason), as a message."""
        return cls("%(text)s", text=text)

    # --- rendering

    def _render(self, translate: bool) -> str:
        if self.en is not None and (not translate or gettext(self.id) == self.id):
            return self.en
        args = {name: (value._render(translate) if isinstance(value, Msg) else value)
                for name, value in self.args.items()}
        if self.plural_id:
            count = args[self.count_arg]
            if translate:
                template = ngettext(self.id, self.plural_id, count)
                if template in (self.id, self.plural_id):
                    # Both forms are in the catalogue as plain entries (gettext_noop marks them one by one).
                    template = gettext(self.id if count == 1 else self.plural_id)
            else:
                template = self.id if count == 1 else self.plural_id
        else:
            template = gettext(self.id) if translate and self.id != "%(text)s" else self.id
        return template % args if args or "%%" in template else template

    def __str__(self) -> str:
        return self._render(True)

    def english(self) -> str:
        return self._render(False)

    def __repr__(self) -> str:
        return f"Msg({self.english()!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Msg) and self.data() == other.data()

    def __hash__(self) -> int:
        return hash(self.english())

    # --- storing

    def data(self) -> dict:
        out: dict[str, Any] = {"id": self.id}
        if self.plural_id:
            out["plural"], out["count"] = self.plural_id, self.count_arg
        if self.en is not None:
            out["en"] = self.en
        if self.args:
            out["args"] = {name: (value.data() if isinstance(value, Msg) else value)
                           for name, value in self.args.items()}
        return out

    @classmethod
    def of(cls, data: Any) -> "Msg | None":
        """The Msg stored as `data` (None for none, or for something that is not one)."""
        if not isinstance(data, dict) or not isinstance(data.get("id"), str):
            return None
        args = {name: (cls.of(value) or value) if isinstance(value, dict) else value
                for name, value in (data.get("args") or {}).items()}
        msg = cls(data["id"], **args)
        if data.get("plural"):
            msg.plural_id, msg.count_arg = data["plural"], data.get("count", "")
        if isinstance(data.get("en"), str):
            msg.en = data["en"]
        return msg


def refusal(error_class, msg: Msg, **kwargs):
    """An application error (common.errors) whose message is `msg` in the active language; `.msg` keeps
    the message itself for whoever stores it (a queued request that fails for that reason)."""
    error = error_class(str(msg), **kwargs)
    error.msg = msg
    return error


def msg_of(error) -> Msg:
    """The message of an application error or a refusal, as a Msg (its text verbatim if it has none)."""
    msg = getattr(error, "msg", None)
    return msg if isinstance(msg, Msg) else Msg.verbatim(getattr(error, "message", str(error)))


# English month names: Django's own catalogue translates them.
MONTH_NAMES = ("January", "February", "March", "April", "May", "June", "July", "August", "September", "October",
               "November", "December")


def month_words(moment) -> Msg:
    """A calendar month as people name it ("November 2026")."""
    return Msg(gettext_noop("%(month)s %(year)d"), month=Msg(MONTH_NAMES[moment.month - 1]), year=moment.year)


def as_msg(text: "Msg | str | None") -> Msg | None:
    """A Msg for what a caller passed as a reason: a Msg, plain text (kept verbatim) or nothing."""
    if text is None or text == "":
        return None
    return text if isinstance(text, Msg) else Msg.verbatim(str(text))


def stored(text: "Msg | str | None") -> tuple[str, dict | None]:
    """What to write for `text`: the English column and the JSON column."""
    msg = as_msg(text)
    if msg is None:
        return "", None
    return msg.english(), msg.data()


def stored_reason(instance, name: str = "reason") -> Msg | str:
    """What a model's StoredTextField `name` holds, to carry over to another: its message when it still
    says what the column says, else the column's text."""
    field = instance._meta.get_field(name)
    text = instance.__dict__.get(field.attname, "")
    msg = Msg.of(instance.__dict__.get(field.message_attname))
    return msg if msg is not None and msg.english() == text else text


def json_param(data: dict | None) -> str | None:
    """A message for a JSON column written by hand (common.sql): its JSON text, or NULL."""
    return None if data is None else json.dumps(data, ensure_ascii=False)


def shown(text: str, data: Any) -> str:
    """Stored text as the reader reads it: its message in the active language when it has one that
    still says what the column says, else the column as written."""
    msg = Msg.of(data)
    if msg is None:
        return text
    try:
        if msg.english() != text:
            return text
        return str(msg)
    except (KeyError, TypeError, ValueError):  # a message whose arguments no longer fit its text
        return text


def in_english(msg: "Msg | str") -> str:
    """`msg` in the portal's own language, for what is not for one reader (logs, channels, audit)."""
    if not isinstance(msg, Msg):
        return str(msg)
    with translation.override("en"):
        return str(msg)


# --- the model field ---------------------------------------------------------------------------------

class _ShownText(DeferredAttribute):
    """The attribute of a StoredTextField: the stored text in the reader's language. A data descriptor
    (values live in the instance's __dict__ as for any field), so every read comes through here."""

    def __get__(self, instance, cls=None):
        if instance is None:
            return self
        text = super().__get__(instance, cls)
        data = instance.__dict__.get(self.field.message_attname)  # not loaded (deferred): as written
        return shown(text, data) if data and text else text

    def __set__(self, instance, value) -> None:
        if isinstance(value, Msg):
            instance.__dict__[self.field.message_attname] = value.data()
            value = value.english()
        instance.__dict__[self.field.attname] = value


class StoredTextField(models.TextField):
    """A TextField of text for people whose JSON sibling `message_field` keeps its Msg (module docstring).
    The column holds the English text; the attribute reads in the active language; assigning a Msg
    sets both. Saving, forms and serialization use the column as written."""

    descriptor_class = _ShownText

    def __init__(self, *args, message_field: str, **kwargs) -> None:
        self.message_field = message_field
        super().__init__(*args, **kwargs)

    @property
    def message_attname(self) -> str:
        return self.message_field

    def deconstruct(self):
        name, path, args, kwargs = super().deconstruct()
        kwargs["message_field"] = self.message_field
        return name, path, args, kwargs

    def value_from_object(self, obj):
        return obj.__dict__.get(self.attname, "")

    def pre_save(self, model_instance, add):
        return model_instance.__dict__.get(self.attname, "")
