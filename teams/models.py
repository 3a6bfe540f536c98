"""Teams and their members. Staff users (is_staff) are the platform admins."""
from __future__ import annotations

from datetime import timedelta

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import models
from django.utils import timezone
from django.utils.translation import gettext_lazy as _

from common.zones import zone_named


class Team(models.Model):
    slug = models.SlugField(_("slug"), max_length=64, unique=True)
    name = models.CharField(_("name"), max_length=128)
    max_ge = models.DecimalField(
        verbose_name=_("max GE"), max_digits=8, decimal_places=2, null=True, blank=True,
        help_text=_("Most GPU-equivalents (weights applied) the team may hold across all pools at once; "
                    "empty = no cap"))
    created_at = models.DateTimeField(_("created at"), auto_now_add=True)
    members = models.ManyToManyField(settings.AUTH_USER_MODEL, through="Membership", related_name="teams",
                                     verbose_name=_("members"))

    class Meta:
        ordering = ["slug"]
        verbose_name = _("team")
        verbose_name_plural = _("teams")

    def __str__(self) -> str:
        return self.name

    def clean(self) -> None:
        if self.max_ge is not None and self.max_ge < 0:
            raise ValidationError({"max_ge": ValidationError(_("max_ge must be at least 0 (empty: no cap)."),
                                                             code="min_value")})


class Membership(models.Model):
    class Role(models.TextChoices):
        MEMBER = "member", _("Member")
        MANAGER = "manager", _("Manager")

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="memberships",
                             verbose_name=_("user"))
    team = models.ForeignKey(Team, on_delete=models.CASCADE, related_name="memberships", verbose_name=_("team"))
    role = models.CharField(_("role"), max_length=16, choices=Role.choices, default=Role.MEMBER)
    joined_at = models.DateTimeField(_("joined at"), auto_now_add=True)

    class Meta:
        verbose_name = _("membership")
        verbose_name_plural = _("memberships")
        ordering = ["team__slug", "user__username"]
        constraints = [models.UniqueConstraint(fields=["user", "team"], name="one_membership_per_user_and_team")]

    def __str__(self) -> str:
        return _("%(user)s in %(team)s (%(role)s)") % {"user": self.user, "team": self.team,
                                                        "role": self.get_role_display()}


class ApiToken(models.Model):
    """A user's key for scripts (`Authorization: Token <key>`). The key is shown once, at creation.

    Only its first characters (`prefix`, to find the row) and its SHA-256 (`digest`, to check
    the key) are stored: common.secrets holds that rule. A password change or a deactivation
    deletes the user's tokens (teams/credentials.py).

    What a key may do is narrowed three ways (teams/tokens.py enforces them on every request):
    it ends at `expires_at`, and never later than API_TOKEN_MAX_AGE_DAYS after it was made (so
    staff can shorten the life of every token, old ones included, with one setting); a read-only
    key may only read; a key limited to some teams sees and acts for those teams only, and never
    carries its user's staff powers.
    """

    class Scope(models.TextChoices):
        READ = "read", _("Read only")
        WRITE = "write", _("Read and write")

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="api_tokens",
                             verbose_name=_("user"))
    name = models.CharField(_("name"), max_length=64, blank=True)
    prefix = models.CharField(_("prefix"), max_length=12, unique=True, editable=False)
    digest = models.CharField(_("digest"), max_length=64, editable=False)
    created_at = models.DateTimeField(_("created at"), default=timezone.now, editable=False)
    last_used_at = models.DateTimeField(_("last used at"), null=True, blank=True, editable=False)
    expires_at = models.DateTimeField(
        _("expires at"), null=True, blank=True, editable=False,
        help_text=_("When the key stops working; empty = at the staff-set maximum age (API_TOKEN_MAX_AGE_DAYS)"))
    scope = models.CharField(_("scope"), max_length=8, choices=Scope.choices, default=Scope.WRITE, editable=False)
    teams = models.ManyToManyField(
        Team, blank=True, related_name="+", verbose_name=_("teams"),
        help_text=_("The teams the key may see and act for; none = all of its user's teams"))

    class Meta:
        verbose_name = _("API token")
        verbose_name_plural = _("API tokens")
        ordering = ["user_id", "-created_at"]

    def ends_at(self):
        """When the key stops working: its own expiry or the maximum age, whichever comes first."""
        limit = self.created_at + timedelta(days=settings.API_TOKEN_MAX_AGE_DAYS)
        return min(self.expires_at, limit) if self.expires_at else limit

    def __str__(self) -> str:
        return _("%(prefix)s… (%(name)s)") % {"prefix": self.prefix, "name": self.name or _("unnamed")}


class GroupMapping(models.Model):
    """An identity provider's group (an OIDC claim value or an LDAP group DN) and what it gives its
    members in the portal: a team with a role, staff powers, or both.

    A team named by any mapping is kept by the identity provider: at each single sign-on, the user's
    membership and role there follow their groups, and a user no longer in any of the team's groups
    leaves it (teams/identity.py). Teams no mapping names keep their memberships as managers set them."""

    group = models.CharField(_("group"), max_length=512, help_text=_(
        "The group as the provider names it: an OIDC `groups` claim value, or an LDAP group's DN"))
    team = models.ForeignKey(Team, on_delete=models.CASCADE, null=True, blank=True, related_name="group_mappings",
                             verbose_name=_("team"),
                             help_text=_("The team its members join; empty when it only grants staff"))
    role = models.CharField(_("role"), max_length=16, choices=Membership.Role.choices, default=Membership.Role.MEMBER)
    staff = models.BooleanField(_("staff"), default=False, help_text=_("Its members are platform staff"))

    class Meta:
        verbose_name = _("group mapping")
        verbose_name_plural = _("group mappings")
        ordering = ["group", "team__slug"]
        constraints = [
            models.UniqueConstraint(fields=["group", "team"], name="group_mapping_once_per_team"),
            models.CheckConstraint(condition=models.Q(team__isnull=False) | models.Q(staff=True),
                                   name="group_mapping_gives_something"),
        ]

    def __str__(self) -> str:
        if self.team_id and self.staff:
            gives = _("%(team)s (%(role)s), staff") % {"team": self.team, "role": self.get_role_display()}
        elif self.team_id:
            gives = _("%(team)s (%(role)s)") % {"team": self.team, "role": self.get_role_display()}
        else:
            gives = _("staff")
        return f"{self.group} → {gives}"


class NotificationChannel(models.Model):
    """Somewhere a team's or a person's notifications go beside the usual mail: an e-mail address, a
    generic webhook (JSON signed with HMAC-SHA256), or a Slack, DingTalk, WeCom or Feishu/Lark incoming
    webhook. It receives the events it lists (teams/notify.py EVENTS). Its URL and secret are stored
    encrypted (common.crypto) and never shown back: a chat webhook's URL is itself a credential."""

    class Kind(models.TextChoices):
        EMAIL = "email", _("E-mail")
        WEBHOOK = "webhook", _("Webhook (JSON, HMAC-SHA256 signed)")
        SLACK = "slack", _("Slack")
        DINGTALK = "dingtalk", _("DingTalk")
        WECOM = "wecom", _("WeCom")
        FEISHU = "feishu", _("Feishu / Lark")

    name = models.CharField(_("name"), max_length=64)
    kind = models.CharField(_("kind"), max_length=16, choices=Kind.choices)
    team = models.ForeignKey(Team, on_delete=models.CASCADE, null=True, blank=True, related_name="channels",
                             verbose_name=_("team"))
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, null=True, blank=True,
                             related_name="notification_channels", verbose_name=_("user"))
    email = models.EmailField(_("e-mail"), blank=True, help_text=_("e-mail channels: the address"))
    url_encrypted = models.TextField(_("URL (encrypted)"), blank=True, editable=False)
    secret_encrypted = models.TextField(_("secret (encrypted)"), blank=True, editable=False)
    events = models.JSONField(_("events"), default=list,
                              help_text=_("The events it receives (names from teams/notify.py)"))
    enabled = models.BooleanField(_("enabled"), default=True)
    created_at = models.DateTimeField(_("created at"), auto_now_add=True)
    last_attempt_at = models.DateTimeField(_("last attempt at"), null=True, blank=True, editable=False)
    last_error = models.TextField(_("last error"), blank=True, editable=False)
    failing_since = models.DateTimeField(_("failing since"), null=True, blank=True, editable=False,
                                         help_text=_("Set while its deliveries fail; cleared by the next success"))

    class Meta:
        verbose_name = _("notification channel")
        verbose_name_plural = _("notification channels")
        ordering = ["team__slug", "user__username", "name"]
        constraints = [models.CheckConstraint(
            condition=(models.Q(team__isnull=False, user__isnull=True) | models.Q(team__isnull=True, user__isnull=False)),
            name="channel_of_a_team_or_a_person")]

    def __str__(self) -> str:
        return _("%(name)s (%(kind)s) of %(owner)s") % {"name": self.name, "kind": self.get_kind_display(),
                                                         "owner": self.team or self.user}


class Delivery(models.Model):
    """One event sent to one channel: the truth the delivery task works from. A failed attempt is tried
    again later (backoff doubling from NOTIFY_RETRY_SECONDS) until NOTIFY_ATTEMPTS, then given up."""

    class Status(models.TextChoices):
        PENDING = "pending", _("Pending")
        SENT = "sent", _("Sent")
        GIVEN_UP = "given_up", _("Given up")

    channel = models.ForeignKey(NotificationChannel, on_delete=models.CASCADE, related_name="deliveries",
                                verbose_name=_("channel"))
    event = models.CharField(_("event"), max_length=64)
    payload = models.JSONField(_("payload"), help_text=_("subject, text, link and data of the notification"))
    status = models.CharField(_("status"), max_length=16, choices=Status.choices, default=Status.PENDING)
    attempts = models.PositiveIntegerField(_("attempts"), default=0)
    next_attempt_at = models.DateTimeField(_("next attempt at"), null=True, blank=True)
    response_status = models.PositiveIntegerField(_("response status"), null=True, blank=True)
    last_error = models.TextField(_("last error"), blank=True)
    created_at = models.DateTimeField(_("created at"), default=timezone.now)
    delivered_at = models.DateTimeField(_("delivered at"), null=True, blank=True)

    class Meta:
        verbose_name = _("delivery")
        verbose_name_plural = _("deliveries")
        ordering = ["-created_at", "-pk"]
        indexes = [models.Index(fields=["next_attempt_at"], condition=models.Q(status="pending"),
                                name="delivery_due")]


class Preference(models.Model):
    """How one person wants the pages: a language and a time zone. Empty = follow the browser (its
    Accept-Language and the zone timezone.js reports). portal/preferences.py applies them."""

    user = models.OneToOneField(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, primary_key=True,
                                related_name="preference", verbose_name=_("user"))
    language = models.CharField(_("language"), max_length=16, blank=True, choices=settings.LANGUAGES)
    time_zone = models.CharField(_("time zone"), max_length=64, blank=True,
                                 help_text=_("An IANA zone, e.g. Asia/Shanghai"))

    class Meta:
        verbose_name = _("preference")
        verbose_name_plural = _("preferences")

    def clean(self) -> None:
        if self.time_zone and zone_named(self.time_zone) is None:
            raise ValidationError({"time_zone": ValidationError(
                _("Not a time zone name (IANA, e.g. Asia/Shanghai)."), code="unknown_zone")})

    def __str__(self) -> str:
        return _("%(user)s: %(language)s, %(zone)s") % {
            "user": self.user, "language": self.language or _("browser"), "zone": self.time_zone or _("browser")}
