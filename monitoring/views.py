"""Pages: a pool's and a node's live charts (Plotly over WebSockets), and the dashboard's usage block."""
from __future__ import annotations

from django.conf import settings
from django.contrib.admin.views.decorators import staff_member_required
from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import render
from django.urls import reverse
from django.utils.translation import gettext as _
from django.utils.translation import pgettext

from allocations.selectors import pool_gpu_bars, pools_visible_to
from common.errors import ServiceUnavailable
from monitoring import hot, selectors
from monitoring.models import Alert
from inventory.models import GpuPool, Node
from teams.models import Team
from teams.selectors import teams_of

# Points each chart keeps (1 Hz → the last five minutes); older ones scroll out.
WINDOW = 300


def _chart_context(gpus: list[tuple[int, str, int]], title: str, ws_path: str, history_url: str,
                   holders: dict[int, list[dict]] | None = None) -> dict:
    """gpus: (id, label, node id) of each GPU to chart; holders: gpu id → who holds it now (team, and the
    reservation's id and link where the viewer may open it), for the heatmap's booked strip, hovers and table."""
    ids = [gpu_id for gpu_id, _, _ in gpus]
    holders = holders or {}
    history = selectors.pool_history(ids, "5m")  # 1-second points, as the live ones
    series = {}
    for gpu_id in ids:
        points = history.series.get(gpu_id, {})
        series[gpu_id] = {m: [[ts, None if avg is None else round(avg, 1)] for ts, avg, _ in points.get(m, [])]
                          [-WINDOW:] for m in selectors.HISTORY_METRICS}
    latest = hot.latest_get((gpu_id, node_id) for gpu_id, _, node_id in gpus)
    return {
        "title": title,
        "ws_path": ws_path,
        "rows": [(gpu_id, label, latest.get(gpu_id), node_id, holders.get(gpu_id, []))
                 for gpu_id, label, node_id in gpus],
        "ranges": [("live", _("Live 5 min")), ("1h", _("1 h")), ("24h", _("24 h")), ("7d", _("7 days")),
                   ("30d", _("30 days"))],
        "chart_data": {"window": WINDOW, "history_url": history_url, "words": chart_words(),
                       "gpus": [{"id": gpu_id, "label": label, "node": node_id, "holders": holders.get(gpu_id, [])}
                                for gpu_id, label, node_id in gpus],
                       "history": series},
    }


def chart_words() -> dict[str, str]:
    """What static/js/live-charts.js writes, in the viewer's language: it has no catalogue of its own and
    reads these from the page (chart_data.words). `{name}` placeholders are filled in by the script."""
    return {
        "free": _("free"),
        "none": _("none"),
        # xgettext:no-python-format
        "hover_util": _("{value} % utilization"),
        "no_selection": _("No GPU selected: tick some in the table or click a row of the heatmap."),
        "full": _("at most 10 lines: untick one first."),
        "day": _("day"), "days": _("{n} days"), "hour": _("hour"), "hours": _("{n} hours"),
        "minute": _("minute"), "minutes": _("{n} minutes"), "seconds": _("{n} s"),
        "live_note": _("Live, once a second: the last {window} s."),
        "loading": _("Loading the last {range}…"),
        "load_failed": _("Could not load the last {range}: {error}."),
        "answered": _("the portal answered {status}"),
        "range_note": _("The last {range}: averages per {step} ({resolution} history); the live feed keeps "
                        "the table current."),
        "resolutions": {"raw": pgettext("history resolution", "raw"),
                        "minute": pgettext("history resolution", "minute"),
                        "hour": pgettext("history resolution", "hour")},
        "memory_in_use": _("memory in use: {used} of {total} MiB"),
        "share_use": _("uses {used} of {allocated} MiB"),
        "connected": _("connected"),
        "disconnected": _("disconnected, retrying…"),
        "alert": _("alert {state}: {rule} on {subject}"),
        "states": {state.value: str(state.label) for state in Alert.State},
    }


def _holders(bars: list) -> dict[int, list[dict]]:
    """gpu id → its holders now from the pool's GPU bars (allocations.selectors.pool_gpu_bars decides what
    the viewer may see): team name, part, and the reservation's id and link when the viewer may open it."""
    slugs = {seg.team for bar in bars for seg in bar.holders}
    names = dict(Team.objects.filter(slug__in=slugs).values_list("slug", "name"))
    return {bar.gpu_id: [{"team": names.get(seg.team, seg.team), "part": seg.part,
                          "reservation": seg.reservation_id if seg.visible else None,
                          "url": reverse("reservation", args=[seg.reservation_id]) if seg.visible else None}
                         for seg in bar.holders]
            for bar in bars}


@login_required
def pool_live(request: HttpRequest, slug: str) -> HttpResponse:
    pool = selectors.pool_for_viewer(request.user, slug)
    if pool is None:
        raise Http404(_("No such pool, or not one your teams use."))
    gpus = [(g.pk, f"{g.node.name}:{g.index}", g.node_id)
            for g in pool.gpus.select_related("node").order_by("node__name", "index")]
    bars = pool_gpu_bars(pool, request.user)
    context = _chart_context(gpus, pool.name, f"/ws/pools/{pool.slug}/",
                             reverse("api:pool-telemetry", args=[pool.slug]), _holders(bars))
    clusters = set(pool.gpus.values_list("node__cluster_id", flat=True))
    nodes = Node.objects.filter(gpus__pool=pool).distinct().select_related("cluster").order_by("name")
    context.update(telemetry=selectors.telemetry_sources(clusters) if clusters else [])
    context.update(pool=pool, nodes=nodes, alerts=selectors.alerts_visible_to(request.user).filter(
        pool=pool, state__in=["pending", "firing"])[:50],
        gpu_bars=_with_memory_used(bars, context["rows"]))
    return render(request, "monitoring/pool.html", context)


def _with_memory_used(bars: list, rows: list) -> list[tuple]:
    """Each GPU bar with the card's memory in use now, (used, total) MiB from the hot values (None when
    unknown); live-charts.js moves it with every sample."""
    latest = {row[0]: row[2] for row in rows}
    out = []
    for bar in bars:
        sample = latest.get(bar.gpu_id)
        used = getattr(sample, "mem_used", None)
        total = getattr(sample, "mem_total", None) or bar.memory_mib
        out.append((bar, (used, total) if used is not None and total else None))
    return out


@login_required
def node_live(request: HttpRequest, node_id: int) -> HttpResponse:
    node = selectors.node_for_viewer(request.user, node_id)
    if node is None:
        raise Http404(_("No such node, or not one you may watch."))
    gpus = [(g.pk, f"GPU {g.index}", node.pk) for g in node.gpus.order_by("index")]
    holders = {}
    for pool in GpuPool.objects.filter(gpus__node=node).distinct():
        holders.update(_holders([bar for bar in pool_gpu_bars(pool, request.user) if bar.gpu_id in
                                 {gpu_id for gpu_id, _, _ in gpus}]))
    context = _chart_context(gpus, f"{node.cluster.slug}/{node.name}", f"/ws/nodes/{node.pk}/",
                             reverse("api:node-telemetry", args=[node.pk]), holders)
    sources = selectors.telemetry_sources([node.cluster_id])
    context.update(node=node, alerts=selectors.alerts_visible_to(request.user).filter(
        node=node, state__in=["pending", "firing"])[:50],
        pools=GpuPool.objects.filter(gpus__node=node).distinct().order_by("slug"),
        leases=selectors.node_leases(node) if request.user.is_staff else None,
        telemetry=sources[0] if sources else None,
        unleased=[u for u in sources[0].row.unleased if u.get("node") == node.name]
        if sources and sources[0].row and request.user.is_staff else [])
    return render(request, "monitoring/node.html", context)


@staff_member_required
def telemetry_sources(request: HttpRequest) -> HttpResponse:
    """Staff: each Kubernetes cluster's telemetry source, last successful read, lag, series, unknown GPUs,
    pods without a reservation, errors."""
    return render(request, "monitoring/telemetry_sources.html", {"sources": selectors.telemetry_sources()})


def dashboard_context(user) -> dict:
    """What the dashboard shows of telemetry: allocated vs used per pool and team, idle GPUs, open alerts.
    The usage needs the hot values in Redis; while Redis is unreachable the rest of the dashboard still shows."""
    try:
        activity = selectors.pool_activity(pools_visible_to(user))
        _pools, teams = selectors.usage(pools_visible_to(user).none(), teams_of(user))
        usage_unavailable = False
    except ServiceUnavailable:
        activity, teams, usage_unavailable = [], [], True
    return {
        "usage_unavailable": usage_unavailable,
        "idle_threshold": settings.TELEMETRY_IDLE_UTIL_PCT,
        "activity_pools": activity,
        "usage_teams": teams,
        "idle_gpus": [gpu for p in activity for gpu in p.idle_bookings],
        "outside_gpus": [gpu for p in activity for gpu in p.outside_use],
        "open_alerts": list(selectors.alerts_visible_to(user).filter(state__in=["pending", "firing"])
                            .order_by("-state", "-active_since")[:20]),
    }
