"""Teams and their members. Staff users (is_staff) are the platform admins."""
from __future__ import annotations

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import models
from django.utils import timezone


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
    """

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="api_tokens")
    name = models.CharField(max_length=64, blank=True)
    prefix = models.CharField(max_length=12, unique=True, editable=False)
    digest = models.CharField(max_length=64, editable=False)
    created_at = models.DateTimeField(default=timezone.now, editable=False)
    last_used_at = models.DateTimeField(null=True, blank=True, editable=False)

    class Meta:
        verbose_name = "API token"
        ordering = ["user_id", "-created_at"]

    def __str__(self) -> str:
        return f"{self.prefix}… ({self.name or 'unnamed'})"
