"""Teams and their members. Staff users (is_staff) are the platform admins."""
from __future__ import annotations

from datetime import timedelta

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import models
from django.utils import timezone

from common.zones import zone_named


class Team(models.Model):
    slug = models.SlugField(max_length=64, unique=True)
    name = models.CharField(max_length=128)
    max_ge = models.DecimalField(
        verbose_name="max GE", max_digits=8, decimal_places=2, null=True, blank=True,
        help_text="Most GPU-equivalents (weights applied) the team may hold across all pools at once; empty = no cap")
    created_at = models.DateTimeField(auto_now_add=True)
    members = models.ManyToManyField(settings.AUTH_USER_MODEL, through="Membership", related_name="teams")

    class Meta:
        ordering = ["slug"]

    def __str__(self) -> str:
        return self.name

    def clean(self) -> None:
        if self.max_ge is not None and self.max_ge < 0:
            raise ValidationError({"max_ge": ValidationError("max_ge must be at least 0 (empty: no cap).",
                                                             code="min_value")})


class Membership(models.Model):
    class Role(models.TextChoices):
        MEMBER = "member", "Member"
        MANAGER = "manager", "Manager"

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="memberships")
    team = models.ForeignKey(Team, on_delete=models.CASCADE, related_name="memberships")
    role = models.CharField(max_length=16, choices=Role.choices, default=Role.MEMBER)
    joined_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["team__slug", "user__username"]
        constraints = [models.UniqueConstraint(fields=["user", "team"], name="one_membership_per_user_and_team")]

    def __str__(self) -> str:
        return f"{self.user} in {self.team} ({self.role})"


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
        READ = "read", "Read only"
        WRITE = "write", "Read and write"

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="api_tokens")
    name = models.CharField(max_length=64, blank=True)
    prefix = models.CharField(max_length=12, unique=True, editable=False)
    digest = models.CharField(max_length=64, editable=False)
    created_at = models.DateTimeField(default=timezone.now, editable=False)
    last_used_at = models.DateTimeField(null=True, blank=True, editable=False)
    expires_at = models.DateTimeField(
        null=True, blank=True, editable=False,
        help_text="When the key stops working; empty = at the staff-set maximum age (API_TOKEN_MAX_AGE_DAYS)")
    scope = models.CharField(max_length=8, choices=Scope.choices, default=Scope.WRITE, editable=False)
    teams = models.ManyToManyField(
        Team, blank=True, related_name="+",
        help_text="The teams the key may see and act for; none = all of its user's teams")

    class Meta:
        verbose_name = "API token"
        ordering = ["user_id", "-created_at"]

    def ends_at(self):
        """When the key stops working: its own expiry or the maximum age, whichever comes first."""
        limit = self.created_at + timedelta(days=settings.API_TOKEN_MAX_AGE_DAYS)
        return min(self.expires_at, limit) if self.expires_at else limit

    def __str__(self) -> str:
        return f"{self.prefix}… ({self.name or 'unnamed'})"


class GroupMapping(models.Model):
    """An identity provider's group (an OIDC claim value or an LDAP group DN) and what it gives its
    members in the portal: a team with a role, staff powers, or both.

    A team named by any mapping is kept by the identity provider: at each single sign-on, the user's
    membership and role there follow their groups, and a user no longer in any of the team's groups
    leaves it (teams/identity.py). Teams no mapping names keep their memberships as managers set them."""

    group = models.CharField(max_length=512, help_text="The group as the provider names it: an OIDC `groups` "
                                                       "claim value, or an LDAP group's DN")
    team = models.ForeignKey(Team, on_delete=models.CASCADE, null=True, blank=True, related_name="group_mappings",
                             help_text="The team its members join; empty when it only grants staff")
    role = models.CharField(max_length=16, choices=Membership.Role.choices, default=Membership.Role.MEMBER)
    staff = models.BooleanField(default=False, help_text="Its members are platform staff")

    class Meta:
        ordering = ["group", "team__slug"]
        constraints = [
            models.UniqueConstraint(fields=["group", "team"], name="group_mapping_once_per_team"),
            models.CheckConstraint(condition=models.Q(team__isnull=False) | models.Q(staff=True),
                                   name="group_mapping_gives_something"),
        ]

    def __str__(self) -> str:
        gives = [f"{self.team} ({self.role})"] if self.team_id else []
        if self.staff:
            gives.append("staff")
        return f"{self.group} → {', '.join(gives)}"


class NotificationChannel(models.Model):
    """Somewhere a team's or a person's notifications go beside the usual mail: an e-mail address, a
    generic webhook (JSON signed with HMAC-SHA256), or a Slack, DingTalk, WeCom or Feishu/Lark incoming
    webhook. It receives the events it lists (teams/notify.py EVENTS). Its URL and secret are stored
    encrypted (common.crypto) and never shown back: a chat webhook's URL is itself a credential."""

    class Kind(models.TextChoices):
        EMAIL = "email", "E-mail"
        WEBHOOK = "webhook", "Webhook (JSON, HMAC-SHA256 signed)"
        SLACK = "slack", "Slack"
        DINGTALK = "dingtalk", "DingTalk"
        WECOM = "wecom", "WeCom"
        FEISHU = "feishu", "Feishu / Lark"

    name = models.CharField(max_length=64)
    kind = models.CharField(max_length=16, choices=Kind.choices)
    team = models.ForeignKey(Team, on_delete=models.CASCADE, null=True, blank=True, related_name="channels")
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, null=True, blank=True,
                             related_name="notification_channels")
    email = models.EmailField(blank=True, help_text="e-mail channels: the address")
    url_encrypted = models.TextField(blank=True, editable=False)
    secret_encrypted = models.TextField(blank=True, editable=False)
    events = models.JSONField(default=list, help_text="The events it receives (names from teams/notify.py)")
    enabled = models.BooleanField(default=True)
    created_at = models.DateTimeField(auto_now_add=True)
    last_attempt_at = models.DateTimeField(null=True, blank=True, editable=False)
    last_error = models.TextField(blank=True, editable=False)
    failing_since = models.DateTimeField(null=True, blank=True, editable=False,
                                         help_text="Set while its deliveries fail; cleared by the next success")

    class Meta:
        ordering = ["team__slug", "user__username", "name"]
        constraints = [models.CheckConstraint(
            condition=(models.Q(team__isnull=False, user__isnull=True) | models.Q(team__isnull=True, user__isnull=False)),
            name="channel_of_a_team_or_a_person")]

    def __str__(self) -> str:
        return f"{self.name} ({self.kind}) of {self.team or self.user}"


class Delivery(models.Model):
    """One event sent to one channel: the truth the delivery task works from. A failed attempt is tried
    again later (backoff doubling from NOTIFY_RETRY_SECONDS) until NOTIFY_ATTEMPTS, then given up."""

    class Status(models.TextChoices):
        PENDING = "pending", "Pending"
        SENT = "sent", "Sent"
        GIVEN_UP = "given_up", "Given up"

    channel = models.ForeignKey(NotificationChannel, on_delete=models.CASCADE, related_name="deliveries")
    event = models.CharField(max_length=64)
    payload = models.JSONField(help_text="subject, text, link and data of the notification")
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.PENDING)
    attempts = models.PositiveIntegerField(default=0)
    next_attempt_at = models.DateTimeField(null=True, blank=True)
    response_status = models.PositiveIntegerField(null=True, blank=True)
    last_error = models.TextField(blank=True)
    created_at = models.DateTimeField(default=timezone.now)
    delivered_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at", "-pk"]
        indexes = [models.Index(fields=["next_attempt_at"], condition=models.Q(status="pending"),
                                name="delivery_due")]


class Preference(models.Model):
    """How one person wants the pages: a language and a time zone. Empty = follow the browser (its
    Accept-Language and the zone timezone.js reports). portal/preferences.py applies them."""

    user = models.OneToOneField(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, primary_key=True,
                                related_name="preference")
    language = models.CharField(max_length=16, blank=True, choices=settings.LANGUAGES)
    time_zone = models.CharField(max_length=64, blank=True, help_text="An IANA zone, e.g. Asia/Shanghai")

    def clean(self) -> None:
        if self.time_zone and zone_named(self.time_zone) is None:
            raise ValidationError({"time_zone": ValidationError(
                "Not a time zone name (IANA, e.g. Asia/Shanghai).", code="unknown_zone")})

    def __str__(self) -> str:
        return f"{self.user}: {self.language or 'browser'}, {self.time_zone or 'browser'}"
