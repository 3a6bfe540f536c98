"""The pages: dashboard, reserve (with the availability timeline), my reservations, team, login.

Views are thin: they parse a form, call one service or selector, and render. A refused
request comes back as the same form with the message next to the field it names.
"""
from __future__ import annotations

from datetime import timedelta
from urllib.parse import urlencode

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.core.paginator import Paginator
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.utils import formats, timezone
from django.utils.cache import patch_vary_headers
from django.urls import reverse
from django.utils.http import url_has_allowed_host_and_scheme
from django.utils.translation import gettext as _
from django.utils.translation import pgettext
from django.views.decorators.http import require_POST

from accounting.advice import advice, advice_for_reservation
from allocations import quotas as alloc_quotas
from allocations import selectors as alloc_selectors
from allocations import services as alloc_services
from allocations import shapes as alloc_shapes
from allocations.filters import ReservationFilterSet
from allocations.models import Reservation
from audit.filters import AuditEntryFilterSet
from audit.selectors import audit_entries
from common.errors import ApplicationError
from monitoring import views as monitoring_views
from portal.forms import AvailabilityForm, ExtendForm, KeepForm, MemberAddForm, MemberRemoveForm, ReservationForm
from portal.templatetags.portal_units import booked_words, ge
from portal.timezones import INPUT_FORMAT, people_times, when, zone_label
from teams import services as team_services
from teams.models import Team
from teams.selectors import can_manage_team, teams_of

LIVE_RESERVATIONS_PER_PAGE = 50
AUDIT_ENTRIES_PER_PAGE = 50


def _form_error(form, error: ApplicationError) -> None:
    for item in error.errors:
        field = FORM_FIELD_OF.get(item.field, item.field)
        form.add_error(field if field in form.fields else None, people_times(item.message))


def _pools(user):
    return alloc_selectors.with_occupancy(alloc_selectors.pools_visible_to(user)).order_by("slug")


@login_required
def dashboard(request: HttpRequest) -> HttpResponse:
    now = timezone.now()
    mine = (
        alloc_selectors.reservations_visible_to(request.user)
        .filter(state__in=Reservation.LIVE_STATES + (Reservation.State.RELEASING,))
        .order_by("starts_at")
    )
    pools = list(_pools(request.user))
    for pool_ge in alloc_selectors.pools_ge(pools, now):
        pool_ge.pool.ge = pool_ge
    teams = list(teams_of(request.user).order_by("slug"))
    mine = alloc_selectors.with_allocated_gpus(list(mine))
    return render(request, "portal/dashboard.html", {
        "pools": pools,
        "active": [r for r in mine if r.starts_at <= now],
        "upcoming": [r for r in mine if r.starts_at > now],
        "teams": teams,
        "teams_use": alloc_selectors.teams_use(teams, now),
        **monitoring_views.dashboard_context(request.user),
    })


# Where a service refusal's field has no input of its own on the form.
FORM_FIELD_OF = {"gpu_memory_mib or gpu_memory_pct": "gpu_memory_mib"}


def _availability_context(user, data, pool=None) -> dict:
    """The timeline of a pool for the shape in `data` (the reserve form's amount fields and the models ticked,
    by the API's names), counted by the selector the availability API answers with."""
    if pool is not None:
        data = {**data, "pool": pool.slug}
    form = AvailabilityForm(data)
    if not form.is_valid():
        if "start" in form.errors:
            return {"availability_error": form.errors["start"][0]}
        if "pool" in form.errors:
            return {"availability_error": _("Pick a pool to see when it has room.")}
    if pool is None:
        pool = alloc_selectors.pools_visible_to(user).filter(slug=form.cleaned_data["pool"]).first()
    if pool is None:
        return {"availability_error": _("That pool is not one you can reserve from.")}
    shape_fields = {name: form.cleaned_data.get(name) for name in alloc_shapes.AMOUNT_FIELDS
                    if name in form.cleaned_data and form.cleaned_data.get(name) not in (None, "")}
    team = teams_of(user).filter(slug=form.cleaned_data["team"]).first() if form.cleaned_data.get("team") else None
    quota = alloc_quotas.limits_for(team=team, pool=pool) if team is not None else None
    gpu_models = form.cleaned_data.get("gpu_models") or []
    query = {**shape_fields, "gpu_models": gpu_models, **({"team": team.slug} if team is not None else {})}
    context = {"pool": pool, "range": form.cleaned_data.get("range") or "24h", "team": team,
               "team_without_quota": team is not None and quota is None,
               "ranges": list(AvailabilityForm.RANGES), "shape_query": urlencode(query, doseq=True)}
    bad = [f"{name}: {' '.join(errors)}" for name, errors in form.errors.items()]
    if bad:
        return {**context, "availability_error": _("The timeline needs valid amounts (%(errors)s).") % {
            "errors": "; ".join(bad)}}
    span, slot = AvailabilityForm.RANGES[context["range"]]
    start = max(form.cleaned_data.get("start") or timezone.now(), timezone.now())
    start = timezone.localtime(start).replace(minute=0, second=0, microsecond=0)  # on the hour where people are
    try:
        answer = alloc_selectors.availability(pool, start, start + span, slot,
                                              alloc_shapes.Amounts(**shape_fields), quota=quota, gpu_models=gpu_models)
    except ApplicationError as error:
        return {**context, "availability_error": _("No timeline for that amount: %(error)s") % {
            "error": people_times(error.message)}}
    unit = answer.slots[0].unit if answer.slots else "GPUs"
    return {**context, "slots": answer.slots, "timeline": _timeline_labels(answer.slots), "total": answer.capacity,
            "shape": answer.shape,
            "unit": unit, "unit_words": _unit_words(unit)}


def _unit_words(unit: str) -> str:
    """The timeline's unit (booking.Room's unit, a code: GPUs, shares, instances) as the page says it."""
    return {"GPUs": pgettext("unit", "GPUs"), "shares": pgettext("unit", "shares"),
            "instances": pgettext("unit", "instances")}.get(unit, unit)


def _chosen_pool(pools, slug: str):
    """The pool the form books from: the one named, else the first the user may use."""
    return next((p for p in pools if p.slug == slug), pools[0] if pools else None)


@login_required
def reserve(request: HttpRequest) -> HttpResponse:
    teams = list(teams_of(request.user))
    pools = list(alloc_selectors.pools_visible_to(request.user).order_by("slug"))
    pool = _chosen_pool(pools, request.POST.get("pool") or request.GET.get("pool", ""))
    offer = alloc_selectors.pool_offer(pool) if pool is not None else None
    # gpu_models in the address ticks those models (a link to "reserve H100s" of a pool); the POST's win.
    form = ReservationForm(request.POST or None, teams=teams, pools=pools, offer=offer,
                           initial={"pool": pool.slug if pool else "", "gpu_models": request.GET.getlist("gpu_models")})
    alternatives = []
    if request.method == "POST" and form.is_valid():
        data = form.cleaned_data
        try:
            asked = alloc_services.ReservationRequest(team=data["team"], pool=data["pool"], **form.timing(),
                                                      **form.amounts(), gpu_models=form.gpu_models())
            reservation = alloc_services.reservation_create(actor=request.user, request=asked)
        except ApplicationError as error:
            _form_error(form, error)
            alternatives = [_offer_fields(offer) for offer in error.extra.get("alternatives", ())]
        else:
            if reservation.state == Reservation.State.PENDING:
                entry = reservation.queue_info
                words = {"id": reservation.pk, "pool": pool.name, "position": entry.position,
                         "likely": when(entry.likely_start), "by": when(entry.start_by)}
                if entry.start_by:
                    message = _("Reservation #%(id)s waits in the queue of %(pool)s: position %(position)s, "
                                "likely start %(likely)s, starts by %(by)s.") % words
                else:
                    message = _("Reservation #%(id)s waits in the queue of %(pool)s: position %(position)s.") % words
                messages.success(request, message)
                return redirect("reservation", reservation.pk)
            messages.success(request, _("Reserved %(booked)s of %(pool)s (reservation #%(id)s, %(ge)s GE).") % {
                "booked": booked_words(reservation), "pool": pool.name, "id": reservation.pk,
                "ge": ge(reservation.ge)})
            return redirect("reservations")
    context = {"form": form, "no_choice": not teams or not pools, "offer": offer, "chosen_pool": pool,
               "alternatives": alternatives}
    if pool is not None:
        context.update(_availability_context(request.user, {"range": request.GET.get("range", "24h"),
                                                            **_form_shape(form)}, pool))
    return render(request, "portal/reserve.html", context, status=400 if form.errors else 200)


def _offer_fields(offer: dict) -> dict:
    """An alternative (allocations.alternatives) as the reserve form posts it: its message and its fields, as
    (name, value) pairs (a list, such as gpu_models, is one pair per item, as the form's checkboxes post it)."""
    body = {**offer["request"], "when": "window"}
    fields = [(name, item) for name, value in body.items()
              for item in (value if isinstance(value, list) else [value])]
    return {"kind": offer["kind"], "message": people_times(offer["message"]), "fields": fields}


# At most this many hour labels under a timeline: more run into each other at a phone's width.
TIMELINE_HOUR_LABELS = 8
# Slots a day label ("Wed 25") may run over at the narrowest slot width: the next day label must be further.
TIMELINE_DAY_LABEL_SLOTS = 2


def _timeline_labels(slots) -> list[tuple]:
    """(slot, day label, hour label, start for the form) per slot, in the page's zone: the day where a new
    date begins, and at the first slot unless the next date begins too close for both to fit; the hour on
    every n-th slot only; so no two labels overlap."""
    every = max(1, -(-len(slots) // TIMELINE_HOUR_LABELS))
    starts = [timezone.localtime(slot.start) for slot in slots]
    next_day = next((i for i in range(1, len(starts)) if starts[i].date() != starts[0].date()), len(starts))
    out = []
    for i, (slot, local) in enumerate(zip(slots, starts)):
        new_date = i > 0 and local.date() != starts[i - 1].date()
        first = i == 0 and next_day >= TIMELINE_DAY_LABEL_SLOTS
        # Translators: Django date format letters of a timeline's day label ("Wed 25"): short.
        day = formats.date_format(local, pgettext("date format", "D j")) if new_date or first else ""
        # Translators: Django date format letters of a timeline's hour label ("18h"); \h is a literal h.
        hour = formats.date_format(local, pgettext("date format", "H\\h")) if i % every == 0 else ""
        out.append((slot, day, hour, local.strftime(INPUT_FORMAT)))
    return out


def _next_page(request: HttpRequest) -> str | None:
    """The page a form asks to go back to (`next`), only when it is one of the portal's own: anything else
    (another host, a scheme) would make the portal an open redirect."""
    target = request.POST.get("next") or ""
    if target and url_has_allowed_host_and_scheme(target, allowed_hosts={request.get_host()},
                                                  require_https=request.is_secure()):
        return target
    return None


def _form_shape(form: ReservationForm) -> dict:
    """The team, the amount fields and the models the form shows (posted, else initial), by the API's names,
    for the timeline."""
    shape = {}
    team = form["team"].value() or next((slug for slug, _name in form.fields["team"].choices), "")
    if team:
        shape["team"] = team
    for field in form.amount_fields():
        value = field.value()
        if value not in (None, ""):
            shape[field.name] = value
    models = form.models_field()
    if models is not None and models.value():
        shape["gpu_models"] = list(models.value())
    return shape


@login_required
def reserve_fields(request: HttpRequest) -> HttpResponse:
    """The amount fields of the chosen pool's mode, and its timeline (out of band), for HTMX to swap in when
    the pool changes."""
    pools = list(alloc_selectors.pools_visible_to(request.user).order_by("slug"))
    pool = _chosen_pool(pools, request.GET.get("pool", ""))
    if pool is None:
        raise Http404(_("No pool you can reserve from."))
    form = ReservationForm(teams=(), pools=pools, offer=alloc_selectors.pool_offer(pool), initial={"pool": pool.slug})
    context = {"form": form, "offer": form.offer, "oob": True}
    context.update(_availability_context(request.user, {"range": request.GET.get("range", "24h"),
                                                        "team": request.GET.get("team", ""),
                                                        **_form_shape(form)}, pool))
    return render(request, "portal/_amount_fields.html", context)


@login_required
def availability_partial(request: HttpRequest) -> HttpResponse:
    """The timeline alone, for HTMX to swap in when the range or the amount changes."""
    return render(request, "portal/_availability.html", _availability_context(request.user, request.GET))


@login_required
def reservations(request: HttpRequest) -> HttpResponse:
    # The API's own filters (team, pool, state, starts_after, ends_before), so a link such as
    # /reservations/?team=vision&state=active shows what GET /api/v1/reservations/ would list.
    # A value the filter refuses is named on the page; the other filters still apply.
    filters = ReservationFilterSet(request.GET, queryset=alloc_selectors.reservations_visible_to(request.user))
    visible = filters.qs
    live = visible.filter(state__in=Reservation.LIVE_STATES + (Reservation.State.RELEASING,))
    # Newest ended first through reservation_team_ended: the page must not sort a team's whole history.
    # Pages of live ones: staff see the whole fleet's, which can run into thousands.
    # get_page answers a missing, malformed or too-large ?page= with the first or last page.
    live_page = Paginator(live.order_by("starts_at", "id"),
                          LIVE_RESERVATIONS_PER_PAGE).get_page(request.GET.get("page"))
    # Each row's grants (shares per GPU, MIG instances, vGPU memory and cores): one query for the page.
    live_page.object_list = alloc_selectors.with_allocated_gpus(list(live_page.object_list))
    ended = alloc_selectors.with_allocated_gpus(
        list(visible.filter(state__in=Reservation.FINAL_STATES).order_by("-ended_at", "-id")[:50]))
    waiting = alloc_selectors.with_queue(
        list(visible.filter(state=Reservation.State.PENDING).order_by("pool__slug", "id")[:200]))
    kept = request.GET.copy()
    kept.pop("page", None)
    # HTMX asks again for the waiting and live lists while requests wait: that part alone.
    page = "portal/_reservation_lists.html" if request.headers.get("HX-Request") else "portal/reservations.html"
    response = render(request, page, {
        "waiting": waiting,
        "filters": filters,
        "filtered": any(request.GET.get(name) for name in filters.filters),
        "filter_query": kept.urlencode(),
        "filter_teams": teams_of(request.user).order_by("name").values_list("slug", "name"),
        "filter_pools": alloc_selectors.pools_visible_to(request.user).order_by("name").values_list("slug", "name"),
        "states": Reservation.State.choices,
        "live": live_page,
        "ended": ended,
        "extend_form": ExtendForm(),
        "now": timezone.now(),
    })
    patch_vary_headers(response, ["HX-Request"])
    return response


def _visible_reservation(request: HttpRequest, reservation_id: int) -> Reservation:
    reservation = alloc_selectors.reservations_visible_to(request.user).filter(pk=reservation_id).first()
    if reservation is None:
        raise Http404(_("No such reservation."))
    return reservation


@login_required
def reservation_row(request: HttpRequest, reservation_id: int) -> HttpResponse:
    """One row of the live reservations table, for HTMX to swap in while the reservation moves."""
    reservation = alloc_selectors.with_allocated_gpus([_visible_reservation(request, reservation_id)])[0]
    return render(request, "portal/_reservation_row.html", {"r": reservation, "actions": True, "now": timezone.now()})


@login_required
def reservation_detail(request: HttpRequest, reservation_id: int) -> HttpResponse:
    reservation = alloc_selectors.with_queue(
        alloc_selectors.with_allocated_gpus([_visible_reservation(request, reservation_id)]), every_state=True)[0]
    # HTMX asks again for the page's body while the reservation moves (portal_live): the body alone.
    page = "portal/_reservation_body.html" if request.headers.get("HX-Request") else "portal/reservation_detail.html"
    response = render(request, page, {
        "reservation": reservation,
        "grants": reservation.grants,
        "events": reservation.events.select_related("actor"),
        "apply_jobs": reservation.apply_jobs.select_related("cluster"),
        "extend_form": ExtendForm(initial={"ends_at": timezone.localtime(reservation.ends_at + timedelta(hours=1))}),
        "keep_form": KeepForm(),
        # Outside the part HTMX asks for again while it moves: read once per page, not per poll.
        "advice": [] if request.headers.get("HX-Request") else advice_for_reservation(reservation),
        # While a warning is pending: when the pool's idle reclaim releases it.
        "idle_release_at": (reservation.idle_warned_at + timedelta(minutes=reservation.pool.idle_release_minutes)
                            if reservation.idle_warned_at and reservation.keep_at is None else None),
        "now": timezone.now(),
    })
    patch_vary_headers(response, ["HX-Request"])  # a cache must not answer the page with the body alone
    return response


@login_required
@require_POST
def reservation_keep(request: HttpRequest, reservation_id: int) -> HttpResponse:
    """Mark a reservation keep (with a reason), or unmark it (`unkeep`): the pool's idle reclaim leaves it alone."""
    reservation = _visible_reservation(request, reservation_id)
    form = KeepForm(request.POST)
    try:
        if "unkeep" in request.POST:
            alloc_services.reservation_keep(actor=request.user, reservation_id=reservation.pk, keep=False)
            messages.success(request, _("Reservation #%(id)s is no longer kept.") % {"id": reservation.pk})
        elif not form.is_valid():
            messages.error(request, _("Why keep it: %(error)s") % {"error": form.errors["reason"][0]})
        else:
            alloc_services.reservation_keep(actor=request.user, reservation_id=reservation.pk, keep=True,
                                            reason=form.cleaned_data["reason"])
            messages.success(request, _("Reservation #%(id)s is kept: idle reclaim leaves it alone.") % {
                "id": reservation.pk})
    except ApplicationError as error:
        messages.error(request, people_times(error.message))
    return redirect("reservation", reservation_id=reservation.pk)


@login_required
@require_POST
def reservation_release(request: HttpRequest, reservation_id: int) -> HttpResponse:
    reservation = _visible_reservation(request, reservation_id)
    if request.POST.get("confirm") != "yes":
        # One click must not end a running job's GPUs: without `confirm=yes` (which the button's JavaScript
        # dialog adds) the answer is a page that asks, so the no-JavaScript path asks too.
        cancel = reservation.starts_at > timezone.now()
        next_page = _next_page(request)
        words = {"id": reservation.pk, "team": reservation.team.name, "booked": booked_words(reservation),
                 "pool": reservation.pool.name}
        if cancel:
            question = _("Cancel reservation #%(id)s?") % words
            detail = _("Cancel reservation #%(id)s of team %(team)s, %(booked)s of %(pool)s, now? "
                       "It has not started; its GPUs go back to the pool.") % words
        else:
            question = _("Release reservation #%(id)s?") % words
            detail = _("Release reservation #%(id)s of team %(team)s, %(booked)s of %(pool)s, now? "
                       "Whatever runs on its GPUs loses them.") % words
        return render(request, "portal/confirm.html", {
            "question": question,
            "detail": detail,
            "button": _("Cancel it") if cancel else _("Release"),
            "action": reverse("reservation-release", args=[reservation.pk]),
            "fields": [("next", next_page)] if next_page else [],
            "back": reverse("reservation", args=[reservation.pk]),
        })
    try:
        released = alloc_services.reservation_release(actor=request.user, reservation_id=reservation.pk)
    except ApplicationError as error:
        messages.error(request, people_times(error.message))
    else:
        if released.ends_at <= timezone.now():
            messages.success(request, _("Reservation #%(id)s had already ended; it expires now.") % {
                "id": reservation.pk})
        else:
            messages.success(request, _("Reservation #%(id)s released.") % {"id": reservation.pk})
    return redirect(_next_page(request) or "reservations")


@login_required
@require_POST
def reservation_extend(request: HttpRequest, reservation_id: int) -> HttpResponse:
    reservation = _visible_reservation(request, reservation_id)
    form = ExtendForm(request.POST)
    if not form.is_valid():
        example = timezone.localtime(reservation.ends_at + timedelta(hours=1)).strftime(INPUT_FORMAT)
        messages.error(request, _("Give the new end as a date and a 24-hour time (%(zone)s), e.g. %(example)s.") % {
            "zone": zone_label(), "example": example})
    else:
        try:
            alloc_services.reservation_extend(actor=request.user, reservation_id=reservation.pk,
                                              ends_at=form.cleaned_data["ends_at"])
        except ApplicationError as error:
            messages.error(request, people_times(error.message))
        else:
            messages.success(request, _("Reservation #%(id)s now ends %(end)s.") % {
                "id": reservation.pk, "end": when(form.cleaned_data["ends_at"])})
    return redirect(_next_page(request) or "reservations")


@login_required
def pool_queue(request: HttpRequest, slug: str) -> HttpResponse:
    """The requests waiting in a pool's queue, in the order the next pass tries them. Members see their
    own teams' requests in full and the others' as "another team"; staff see all."""
    pool = get_object_or_404(alloc_selectors.pools_visible_to(request.user), slug=slug)
    return render(request, "portal/pool_queue.html", {
        "pool": pool, "rows": alloc_selectors.pool_queue(pool, request.user), "now": timezone.now()})


@login_required
def team_detail(request: HttpRequest, slug: str) -> HttpResponse:
    team = get_object_or_404(teams_of(request.user), slug=slug)
    form = MemberAddForm(request.POST or None)
    manager = can_manage_team(request.user, team)
    if request.method == "POST":
        try:
            if "remove" in request.POST:
                # Parsed like the add form: a raw NUL byte here reached PostgreSQL (a 500).
                remove = MemberRemoveForm(request.POST)
                if not remove.is_valid():
                    form.add_error(None, _("Remove: %(error)s") % {"error": remove.errors["remove"][0]})
                else:
                    username = remove.cleaned_data["remove"]
                    team_services.membership_remove(actor=request.user, team=team, username=username)
                    messages.success(request, _("Removed %(username)s.") % {"username": username})
                    return redirect("team", slug=team.slug)
            elif form.is_valid():
                team_services.membership_add(actor=request.user, team=team, **form.cleaned_data)
                messages.success(request, _("Added %(username)s.") % {"username": form.cleaned_data["username"]})
                return redirect("team", slug=team.slug)
        except ApplicationError as error:
            _form_error(form, error)
    use = alloc_selectors.team_use(team)
    return render(request, "portal/team.html", {
        "team": team,
        "memberships": team.memberships.select_related("user"),
        "use": use,
        "breakdown": [(pool_use.pool, share) for pool_use in use.pools for share in pool_use.breakdown],
        "can_manage": manager,
        "form": form,
        "advice": advice(teams=Team.objects.filter(pk=team.pk)),
    }, status=400 if form.errors else 200)


@login_required
def audit_log(request: HttpRequest) -> HttpResponse:
    """Staff: the audit log with the API's filters (GET /api/v1/audit/ lists the same entries)."""
    if not request.user.is_staff:
        raise PermissionDenied(_("The audit log is for staff."))
    filters = AuditEntryFilterSet(request.GET, queryset=audit_entries())
    page = Paginator(filters.qs, AUDIT_ENTRIES_PER_PAGE).get_page(request.GET.get("page"))
    kept = request.GET.copy()
    kept.pop("page", None)
    return render(request, "portal/audit.html", {
        "filters": filters,
        "filtered": any(request.GET.get(name) for name in filters.filters),
        "filter_query": kept.urlencode(),
        "page": page,
        "object_types": filters.filters["object_type"].extra["choices"](),
        "sources": filters.filters["source"].extra["choices"],
    })
