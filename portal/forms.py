"""Forms of the pages. They parse; the services decide."""
from __future__ import annotations

from datetime import timedelta

from django import forms
from django.utils import timezone

from allocations.selectors import LATEST_INSTANT
from teams.models import Membership

DATETIME_LOCAL = "%Y-%m-%dT%H:%M"


class DateTimeLocalInput(forms.DateTimeInput):
    input_type = "datetime-local"

    def __init__(self, **kwargs):
        super().__init__(format=DATETIME_LOCAL, **kwargs)


def _local(dt) -> str:
    return timezone.localtime(dt).strftime(DATETIME_LOCAL)


class ReservationForm(forms.Form):
    team = forms.ChoiceField()
    pool = forms.ChoiceField()
    gpus = forms.IntegerField(min_value=1, max_value=1024, initial=1, label="GPUs")
    starts_at = forms.DateTimeField(required=False, widget=DateTimeLocalInput(), label="Starts (UTC)",
                                    help_text="Leave empty to start now.")
    ends_at = forms.DateTimeField(widget=DateTimeLocalInput(), label="Ends (UTC)")

    def __init__(self, *args, teams=(), pools=(), **kwargs):
        super().__init__(*args, **kwargs)
        self.fields["team"].choices = [(t.slug, t.name) for t in teams]
        self.fields["pool"].choices = [(p.slug, f"{p.name} ({p.sharing_mode})") for p in pools]
        if not self.is_bound:
            self.initial.setdefault("ends_at", _local(timezone.now() + timedelta(hours=4)))


class ExtendForm(forms.Form):
    ends_at = forms.DateTimeField(widget=DateTimeLocalInput(), label="New end (UTC)")


class MemberAddForm(forms.Form):
    username = forms.CharField(max_length=150)
    role = forms.ChoiceField(choices=Membership.Role.choices, initial=Membership.Role.MEMBER)


class MemberRemoveForm(forms.Form):
    """The Remove button's username, parsed like the add form's (a NUL byte reached PostgreSQL raw)."""

    remove = forms.CharField(max_length=150)


class AvailabilityForm(forms.Form):
    RANGES = {"24h": (timedelta(hours=24), timedelta(hours=1)), "3d": (timedelta(days=3), timedelta(hours=3)),
              "7d": (timedelta(days=7), timedelta(hours=6))}
    pool = forms.SlugField()
    start = forms.DateTimeField(required=False, widget=DateTimeLocalInput())
    range = forms.ChoiceField(choices=[(k, k) for k in RANGES], required=False)

    def clean_start(self):
        start = self.cleaned_data.get("start")
        if start is not None and start >= LATEST_INSTANT - timedelta(days=7):
            raise forms.ValidationError(f"Start before {LATEST_INSTANT:%Y-%m-%d}.", code="max_value")
        return start
