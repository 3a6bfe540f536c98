"""The notifications page: the channels a person's and their teams' notifications go to (teams/notify.py),
which fail and why, a form to add one, and test and remove buttons."""
from __future__ import annotations

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import reverse
from django.utils.translation import gettext as _
from django.views.decorators.http import require_POST

from common.errors import ApplicationError
from portal.forms import ChannelForm
from teams import services as team_services
from teams.models import Team
from teams.notify import EVENTS
from teams.selectors import can_manage_team, channels_visible_to, teams_of


def _managed_teams(user) -> list[Team]:
    return [team for team in teams_of(user).order_by("name") if can_manage_team(user, team)]


@login_required
def channels(request: HttpRequest) -> HttpResponse:
    form = ChannelForm(request.POST or None, teams=_managed_teams(request.user))
    if request.method == "POST" and form.is_valid():
        data = form.cleaned_data
        team = Team.objects.filter(slug=data["owner"]).first() if data["owner"] else None
        try:
            channel = team_services.channel_create(
                actor=request.user, name=data["name"], kind=data["kind"], team=team, email=data["email"],
                url=data["url"], secret=data["secret"], events=data["events"])
        except ApplicationError as error:
            for item in error.errors:
                form.add_error(item.field if item.field in form.fields else None, item.message)
        else:
            messages.success(request, _("Channel %(name)s added. Send it a test to see that it arrives.") % {
                "name": channel.name})
            return redirect("channels")
    rows = [(channel, channel.user_id == request.user.pk or can_manage_team(request.user, channel.team))
            for channel in channels_visible_to(request.user)]
    return render(request, "portal/channels.html", {"form": form, "rows": rows, "events": EVENTS},
                  status=400 if form.errors else 200)


@login_required
@require_POST
def channel_action(request: HttpRequest, channel_id: int, action: str) -> HttpResponse:
    channel = get_object_or_404(channels_visible_to(request.user), pk=channel_id)
    try:
        if action == "test":
            team_services.channel_test(actor=request.user, channel=channel)
            messages.success(request, _("A test message is on its way to %(name)s.") % {"name": channel.name})
        elif request.POST.get("confirm") != "yes":
            # As release does: without JavaScript's dialog (which adds confirm=yes), a page asks first.
            return render(request, "portal/confirm.html", {
                "question": _("Remove channel %(name)s?") % {"name": channel.name}, "button": _("Remove"),
                "back": reverse("channels"),
                "detail": _("Remove channel %(name)s? Nothing more is sent to it.") % {"name": channel.name},
                "action": reverse("channel-action", args=[channel.pk, "remove"]), "fields": []})
        else:
            team_services.channel_delete(actor=request.user, channel=channel)
            messages.success(request, _("Channel %(name)s removed.") % {"name": channel.name})
    except ApplicationError as error:
        messages.error(request, error.message)
    return redirect("channels")
