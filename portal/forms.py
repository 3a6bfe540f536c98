"""Forms of the pages. They parse; the services decide."""
from __future__ import annotations

from datetime import timedelta

from django import forms
from django.conf import settings
from django.utils import timezone
from django.utils.html import conditional_escape, format_html
from django.utils.safestring import mark_safe
from django.utils.translation import gettext_lazy as _
from django.utils.translation import ngettext

from allocations.queue import parse_duration
from allocations.selectors import LATEST_INSTANT
from allocations.shapes import AMOUNT_LIMITS, gpu_models_problem
from inventory.sharing import REPLICA_MODES
from portal.timezones import INPUT_FORMAT, zone_label
from teams.models import ApiToken, Membership, NotificationChannel, Preference
from teams.notify import EVENTS

class DateTimeLocalInput(forms.DateTimeInput):
    """A time in the page's zone, typed 24-hour ("2026-11-24 18:30"). Not the browser's datetime-local
    picker: it shows the browser's locale (12-hour AM/PM in en-US) whatever the page says."""

    input_type = "text"

    def __init__(self, **kwargs):
        attrs = {"placeholder": "YYYY-MM-DD HH:MM", "inputmode": "numeric", "autocomplete": "off",
                 "pattern": r"\d{4}-\d{2}-\d{2}[ T]\d{2}:\d{2}", **kwargs.pop("attrs", {})}
        super().__init__(format=INPUT_FORMAT, attrs=attrs, **kwargs)


def _local(dt) -> str:
    return timezone.localtime(dt).strftime(INPUT_FORMAT)


class _InPageZone:
    """A label naming the page's zone at render time (the form is built before the zone may matter)."""

    def __init__(self, words):
        self.words = words

    def __str__(self) -> str:
        return f"{self.words} · {zone_label()}"


def _ge(value: float) -> str:
    return f"{value:.2f}".rstrip("0").rstrip(".") if value else "0"


def _ge_text(text, per_card: float, weight: float, **words) -> str:
    """`text` (a translation with %(ge)s and `words`) saying what `per_card` of a card of `weight` GE costs, the
    number marked with `per_card` so that reserve.js recounts it when the models ticked change."""
    number = format_html('<span class="ge-each" data-ge-per-card="{}">{}</span>', per_card, _ge(per_card * weight))
    return mark_safe(conditional_escape(text) % {**{name: conditional_escape(value) for name, value in words.items()},
                                                 "ge": number})


class _OptionData:
    """A choice widget mixin: data attributes per choice value (`option_data`), for reserve.js."""

    def __init__(self, *args, option_data: dict | None = None, **kwargs):
        super().__init__(*args, **kwargs)
        self.option_data = option_data or {}

    def create_option(self, name, value, label, selected, index, subindex=None, attrs=None):
        option = super().create_option(name, value, label, selected, index, subindex=subindex, attrs=attrs)
        option["attrs"] = {**option["attrs"], **self.option_data.get(str(value), {})}
        return option


class _DataSelect(_OptionData, forms.Select):
    pass


class _DataCheckboxes(_OptionData, forms.CheckboxSelectMultiple):
    pass


class GpuModelsField(forms.Field):
    """GPU model names, each value of the parameter one whole name (a page's query string, as the reserve
    form's checkboxes send them), checked by the rule the API keeps (shapes.gpu_models_problem)."""

    widget = forms.MultipleHiddenInput

    def to_python(self, value) -> list[str]:
        return list(value or ())

    def validate(self, value) -> None:
        problem = gpu_models_problem(value) if value else None
        if problem is not None:
            raise forms.ValidationError(problem.message, code=problem.rule)


class ReservationForm(forms.Form):
    """Team, pool, the amount in the pool's unit and the window. The amount fields are the pool's mode's
    (those of the API, so the service's refusals name them): exclusive `gpus`; time_slicing and mps
    `shares`; mig `mig_profile` and `count`; vgpu `gpu_memory_mib` or `gpu_memory_pct`, `gpu_cores_pct`
    and `gpus`. `offer` (allocations.selectors.PoolOffer) is what the chosen pool offers."""

    team = forms.ChoiceField(label=_("Team"))
    pool = forms.ChoiceField(label=_("Pool"))
    when = forms.ChoiceField(choices=[("window", _("In a window I choose")),
                                      ("asap", _("As soon as it fits (wait in the queue if need be)"))],
                             initial="window", required=False, widget=forms.RadioSelect, label=_("When"))
    starts_at = forms.DateTimeField(required=False, widget=DateTimeLocalInput(), label=_InPageZone(_("Starts")),
                                    help_text=_("Leave empty to start now."))
    ends_at = forms.DateTimeField(required=False, widget=DateTimeLocalInput(), label=_InPageZone(_("Ends")))
    duration = forms.CharField(required=False, max_length=32, label=_("For how long"),
                               help_text=_('e.g. "4h", "30m" or "1d12h".'))
    not_after = forms.DateTimeField(required=False, widget=DateTimeLocalInput(),
                                    label=_InPageZone(_("Start no later than")),
                                    help_text=_("Optional: it gives up if it cannot start by then."))

    def __init__(self, *args, teams=(), pools=(), offer=None, **kwargs):
        super().__init__(*args, **kwargs)
        self.fields["team"].choices = [(t.slug, t.name) for t in teams]
        self.fields["pool"].choices = [(p.slug, f"{p.name} ({p.get_sharing_mode_display()})") for p in pools]
        self.offer = offer
        # What a card costs in the amount fields' texts: the heaviest of the models ticked (all when none is).
        self.card_weight = offer.card_weight(self._models_ticked()) if offer is not None else 1.0
        self.amount_names = list(self._amount_fields(offer))
        if offer is not None and len(offer.models) > 1:
            # A pool of one model has nothing to choose; of several, a request may accept only some (the API's
            # gpu_models). None ticked: any model, as an API request that leaves it out.
            self.fields["gpu_models"] = forms.MultipleChoiceField(
                required=False, label=_("GPU models"),
                widget=_DataCheckboxes(option_data={model: {"data-ge": weight} for model, weight in offer.models}),
                choices=[(model, _("%(model)s (%(ge)s GE a GPU)") % {"model": model, "ge": _ge(weight)})
                         for model, weight in offer.models],
                help_text=_("Only these models; leave all unticked for any model of the pool."))
        self.order_fields(["team", "pool", *self.amount_names, "gpu_models", "when", "starts_at", "ends_at",
                           "duration", "not_after"])
        if not self.is_bound:
            self.initial.setdefault("ends_at", _local(timezone.now() + timedelta(hours=4)))

    def _models_ticked(self) -> list[str]:
        """The models the form shows ticked: posted, else initial."""
        if not self.is_bound:
            return list(self.initial.get("gpu_models") or ())
        return self.data.getlist("gpu_models") if hasattr(self.data, "getlist") else list(
            self.data.get("gpu_models") or ())

    def _amount_fields(self, offer):
        """Add the amount fields of the pool's mode; yield their names. Their texts say what a card costs
        (card_weight), the number marked for reserve.js to recount when the models ticked change."""
        mode = offer.mode if offer is not None else "exclusive"
        fields = self.fields
        weight = self.card_weight
        if mode in REPLICA_MODES:
            n = offer.replicas
            fields["shares"] = forms.IntegerField(
                min_value=1, max_value=max(n, 1), initial=1, label=_("Shares (of %(n)s per GPU)") % {"n": n},
                help_text=_ge_text(_("One share is 1/%(n)s of a GPU: %(ge)s GE. All the shares sit on one GPU."),
                                   1 / n if n else 1.0, weight, n=n))
            yield "shares"
        elif mode == "mig":
            # An instance costs its share of the card it is carved from: GE per instance / GE of the pool's card.
            per_card = {name: ge / offer.weight if offer.weight else 0.0 for name, ge, _mib in offer.mig_profiles}
            label = _("%(profile)s (%(ge)s GE each)")
            fields["mig_profile"] = forms.ChoiceField(
                label=_("MIG profile"),
                choices=[(name, label % {"profile": name, "ge": _ge(per_card[name] * weight)})
                         for name, _cost, _mib in offer.mig_profiles],
                widget=_DataSelect(option_data={
                    name: {"data-ge-per-card": per_card[name], "data-ge-label": label % {"profile": name, "ge": "{ge}"}}
                    for name, _cost, _mib in offer.mig_profiles}))
            fields["count"] = forms.IntegerField(initial=1, label=_("Instances"), **AMOUNT_LIMITS["count"])
            yield from ("mig_profile", "count")
        elif mode == "vgpu":
            fields["gpu_memory_mib"] = forms.IntegerField(
                required=False, label=_("Memory per GPU (MiB)"), **AMOUNT_LIMITS["gpu_memory_mib"],
                initial=offer.default_memory_mib,
                help_text=(_("Of %(mib)s MiB per card.") % {"mib": offer.gpu_memory_mib}
                           if offer.gpu_memory_mib else ""))
            fields["gpu_memory_pct"] = forms.IntegerField(required=False,
                                                          # xgettext:no-python-format
                                                          label=_("or memory per GPU (% of the card)"),
                                                          **AMOUNT_LIMITS["gpu_memory_pct"])
            fields["gpu_cores_pct"] = forms.IntegerField(
                required=False, label=_("Cores per GPU (%)"), **AMOUNT_LIMITS["gpu_cores_pct"],
                initial=offer.default_cores_pct,
                help_text=_("Leave empty for the pool's default, else the memory's share."))
            fields["gpus"] = forms.IntegerField(
                initial=1, required=False, label=_("GPUs (of one node)"), **AMOUNT_LIMITS["gpus"],
                help_text=_ge_text(_("Each GPU costs the larger of its memory and cores shares × %(ge)s GE."),
                                   1.0, weight))
            yield from ("gpu_memory_mib", "gpu_memory_pct", "gpu_cores_pct", "gpus")
        else:
            fields["gpus"] = forms.IntegerField(initial=1, label=_("GPUs"),
                                                help_text=_ge_text(_("Whole GPUs: %(ge)s GE each."), 1.0, weight),
                                                **AMOUNT_LIMITS["gpus"])
            yield "gpus"

    def clean(self):
        data = super().clean()
        data["when"] = data.get("when") or "window"
        if data["when"] == "asap":
            if not data.get("duration"):
                self.add_error("duration", _("Say for how long, e.g. 4h."))
            elif parse_duration(data["duration"]) is None:
                self.add_error("duration", _('Not a duration: give e.g. "4h", "30m" or "1d12h".'))
            else:
                data["duration"] = parse_duration(data["duration"])
        elif data.get("ends_at") is None and "ends_at" not in self.errors:
            self.add_error("ends_at", _("Give the end of the window."))
        return data

    def timing(self) -> dict:
        """The request's times, by the API's names."""
        data = self.cleaned_data
        if data["when"] == "asap":
            return {"duration": data["duration"], "not_after": data.get("not_after")}
        return {"starts_at": data.get("starts_at"), "ends_at": data["ends_at"]}

    def amounts(self) -> dict:
        """The amount fields given, by the API's names."""
        return {name: self.cleaned_data[name] for name in self.amount_names
                if self.cleaned_data.get(name) not in (None, "")}

    def gpu_models(self) -> list[str] | None:
        """The models ticked, by the API's name (None: the pool has one model, or none is ticked: any)."""
        return list(self.cleaned_data.get("gpu_models") or ()) or None

    def amount_fields(self):
        return [self[name] for name in self.amount_names]

    def models_field(self):
        return self["gpu_models"] if "gpu_models" in self.fields else None

    def other_fields(self, *names):
        return [self[name] for name in names]


class ExtendForm(forms.Form):
    ends_at = forms.DateTimeField(widget=DateTimeLocalInput(), label=_InPageZone(_("New end")))


class KeepForm(forms.Form):
    reason = forms.CharField(max_length=200, required=False, label=_("Why keep it"),
                             widget=forms.TextInput(attrs={"placeholder": _("e.g. interactive debugging tonight")}))


class MemberAddForm(forms.Form):
    username = forms.CharField(max_length=150, label=_("Username"))
    role = forms.ChoiceField(choices=Membership.Role.choices, initial=Membership.Role.MEMBER, label=_("Role"))


class MemberRemoveForm(forms.Form):
    """The Remove button's username, parsed like the add form's (a NUL byte reached PostgreSQL raw)."""

    remove = forms.CharField(max_length=150)


class AvailabilityForm(forms.Form):
    RANGES = {"24h": (timedelta(hours=24), timedelta(hours=1)), "3d": (timedelta(days=3), timedelta(hours=3)),
              "7d": (timedelta(days=7), timedelta(hours=6))}
    pool = forms.SlugField()
    # The team the reserve form books for: the timeline counts what its quota still allows.
    team = forms.SlugField(required=False)
    start = forms.DateTimeField(required=False, widget=DateTimeLocalInput())
    range = forms.ChoiceField(choices=[(k, k) for k in RANGES], required=False)
    # The shape to count, by the API's names (the reserve form's amount fields); see AvailabilityQuery.
    gpus = forms.IntegerField(required=False, **AMOUNT_LIMITS["gpus"])
    shares = forms.IntegerField(required=False, **AMOUNT_LIMITS["shares"])
    mig_profile = forms.CharField(max_length=32, required=False)
    count = forms.IntegerField(required=False, **AMOUNT_LIMITS["count"])
    gpu_memory_mib = forms.IntegerField(required=False, **AMOUNT_LIMITS["gpu_memory_mib"])
    gpu_memory_pct = forms.IntegerField(required=False, **AMOUNT_LIMITS["gpu_memory_pct"])
    gpu_cores_pct = forms.IntegerField(required=False, **AMOUNT_LIMITS["gpu_cores_pct"])
    # The models the reserve form ticks: the timeline counts only their GPUs (empty: any model).
    gpu_models = GpuModelsField(required=False)

    def clean_start(self):
        start = self.cleaned_data.get("start")
        if start is not None and start >= LATEST_INSTANT - timedelta(days=7):
            raise forms.ValidationError(_("Start before %(date)s.") % {"date": LATEST_INSTANT.strftime("%Y-%m-%d")},
                                        code="max_value")
        return start


class TokenForm(forms.Form):
    """A new API token: a name, a scope, optionally some of the user's teams, and a life in days."""

    name = forms.CharField(max_length=64, required=False, label=_("Name"),
                           help_text=_("What it is for, e.g. “CI on gitlab”."))
    scope = forms.ChoiceField(choices=ApiToken.Scope.choices, initial=ApiToken.Scope.WRITE, label=_("Scope"))
    teams = forms.MultipleChoiceField(required=False, widget=forms.CheckboxSelectMultiple, label=_("Teams"),
                                      help_text=_("None ticked: all of your teams."))
    days = forms.TypedChoiceField(coerce=int, label=_("Expires in"), initial=90)

    def __init__(self, *args, team_choices=(), max_days: int = 365, **kwargs):
        super().__init__(*args, **kwargs)
        self.fields["teams"].choices = list(team_choices)
        choices = sorted({d for d in (7, 30, 90, 180, 365) if d <= max_days} | {max_days})
        self.fields["days"].choices = [(d, ngettext("%(days)d day", "%(days)d days", d) % {"days": d})
                                       for d in choices]
        self.fields["days"].initial = min(90, max_days)


class TokenRevokeForm(forms.Form):
    prefix = forms.SlugField(max_length=12)


class ChannelForm(forms.Form):
    """A notification channel: whose, which kind, where, and which events (teams/notify.py)."""

    name = forms.CharField(max_length=64, label=_("Name"))
    owner = forms.ChoiceField(label=_("For"), required=False, help_text=_("Yourself, or a team you manage."))
    kind = forms.ChoiceField(choices=NotificationChannel.Kind.choices, label=_("Kind"))
    email = forms.EmailField(required=False, label=_("Email"), help_text=_("E-mail channels: the address."))
    url = forms.URLField(required=False, max_length=2000, label=_("Webhook URL"), assume_scheme="https",
                         help_text=_("Webhook, Slack, DingTalk, WeCom, Feishu: the incoming webhook's URL."))
    secret = forms.CharField(required=False, max_length=256, widget=forms.PasswordInput(render_value=False),
                             label=_("Secret"),
                             help_text=_("Webhook: the signing key; DingTalk, Feishu: the robot's signing secret."))
    events = forms.MultipleChoiceField(widget=forms.CheckboxSelectMultiple, choices=list(EVENTS.items()),
                                       label=_("Events"))

    def __init__(self, *args, teams=(), **kwargs):
        super().__init__(*args, **kwargs)
        self.fields["owner"].choices = [("", _("Me"))] + [(team.slug, _("Team %(name)s") % {"name": team.name})
                                                          for team in teams]


class LanguageForm(forms.Form):
    """The header's switcher."""

    language = forms.ChoiceField(choices=settings.LANGUAGES)


class PreferenceForm(forms.ModelForm):
    """A person's saved language and time zone; empty follows the browser."""

    class Meta:
        model = Preference
        fields = ["language", "time_zone"]
        labels = {"language": _("Language"), "time_zone": _("Time zone")}
        help_texts = {"language": _("Empty: the browser's language."),
                      "time_zone": _("An IANA zone such as Asia/Shanghai; empty: the browser's zone.")}
        widgets = {"time_zone": forms.TextInput(attrs={"list": "zones", "autocomplete": "off"})}

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.fields["language"].choices = [("", _("Follow my browser")), *settings.LANGUAGES]
