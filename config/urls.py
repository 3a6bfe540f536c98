"""Every URL of the portal: pages, the REST API under /api/v1/, admin, health and metrics."""
from django.contrib import admin
from django.contrib.auth import views as auth_views
from django.http import HttpRequest, HttpResponseRedirect
from django.templatetags.static import static
from django.urls import include, path
from django.utils.translation import gettext_lazy
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerView
from rest_framework.routers import DefaultRouter

from allocations.api.agent import LeasesView
from allocations.api.views import (
    ApplyJobViewSet,
    PoolViewSet,
    PriorityClassViewSet,
    QuotaViewSet,
    ReservationViewSet,
    TeamUsageView,
)
from accounting.api.advice import AdviceView
from accounting.api.views import PriceViewSet, StatementView, UsageView
from allocations.webhooks import urlpatterns as kube_webhooks
from audit.api.views import AuditEntryListView
from config import health, metrics
from inventory.api.agent import HeartbeatView, RegisterView
from inventory.api.views import ClusterViewSet, GpuModelViewSet, GpuViewSet, HostTokenViewSet, NodeViewSet
from monitoring.api.views import (AlertRuleViewSet, AlertViewSet, NodeHistoryView, PoolHistoryView, SilenceViewSet,
                                   TelemetryView)
from portal import channels, preferences, tokens, views
from teams.api.views import ApiTokenViewSet, ChannelViewSet, GroupMappingViewSet, MeView, TeamViewSet, TokenView

# The admin says whose it is: staff reach it from the portal's nav.
admin.site.site_header = gettext_lazy("GPU Pool Portal administration")
admin.site.site_title = gettext_lazy("GPU Pool Portal admin")
admin.site.index_title = gettext_lazy("Pools, quotas, reservations and alerts")

router = DefaultRouter()
router.register("reservations", ReservationViewSet, basename="reservation")
router.register("pools", PoolViewSet, basename="pool")
router.register("quotas", QuotaViewSet, basename="quota")
router.register("priority-classes", PriorityClassViewSet, basename="priority-class")
router.register("apply-jobs", ApplyJobViewSet, basename="apply-job")
router.register("teams", TeamViewSet, basename="team")
router.register("tokens", ApiTokenViewSet, basename="api-token")
router.register("group-mappings", GroupMappingViewSet, basename="group-mapping")
router.register("notification-channels", ChannelViewSet, basename="notification-channel")
router.register("clusters", ClusterViewSet, basename="cluster")
router.register("nodes", NodeViewSet, basename="node")
router.register("gpus", GpuViewSet, basename="gpu")
router.register("gpu-models", GpuModelViewSet, basename="gpu-model")
router.register("host-tokens", HostTokenViewSet, basename="host-token")
router.register("alert-rules", AlertRuleViewSet, basename="alert-rule")
router.register("alerts", AlertViewSet, basename="alert")
router.register("silences", SilenceViewSet, basename="silence")
router.register("prices", PriceViewSet, basename="price")

api = [
    path("auth/token/", TokenView.as_view(), name="token"),
    path("me/", MeView.as_view(), name="me"),
    path("agent/register/", RegisterView.as_view(), name="agent-register"),
    path("agent/heartbeat/", HeartbeatView.as_view(), name="agent-heartbeat"),
    path("agent/telemetry/", TelemetryView.as_view(), name="agent-telemetry"),
    path("pools/<slug:slug>/telemetry/", PoolHistoryView.as_view(), name="pool-telemetry"),
    path("nodes/<int:node_id>/telemetry/", NodeHistoryView.as_view(), name="node-telemetry"),
    path("agent/leases/", LeasesView.as_view(), name="agent-leases"),
    # Beside the teams' routes: a team's use is the allocations app's to read (teams know no bookings).
    path("teams/<slug:slug>/usage/", TeamUsageView.as_view(), name="team-usage"),
    path("audit/", AuditEntryListView.as_view(), name="audit"),
    path("usage/", UsageView.as_view(), name="usage"),
    path("advice/", AdviceView.as_view(), name="advice"),
    path("teams/<slug:slug>/statements/<str:month>/", StatementView.as_view(), name="team-statement"),
    path("schema/", SpectacularAPIView.as_view(), name="schema"),
    path("docs/", SpectacularSwaggerView.as_view(url_name="api:schema"), name="docs"),
    path("", include(router.urls)),
]

# JSON 404s under /api/ (unknown routes, lookups the routes' patterns refuse).
handler404 = "config.exception_handler.not_found"
handler400 = "config.exception_handler.bad_request"
handler500 = "config.exception_handler.server_error"



def favicon(request: HttpRequest) -> HttpResponseRedirect:
    """Browsers ask /favicon.ico whatever the page links: send them to the SVG icon the pages link to."""
    return HttpResponseRedirect(static("favicon.svg"))


urlpatterns = [
    path("favicon.ico", favicon, name="favicon"),
    path("", views.dashboard, name="dashboard"),
    path("reserve/", views.reserve, name="reserve"),
    path("reserve/availability/", views.availability_partial, name="availability"),
    path("reserve/fields/", views.reserve_fields, name="reserve-fields"),
    path("reservations/", views.reservations, name="reservations"),
    path("reservations/<int:reservation_id>/", views.reservation_detail, name="reservation"),
    path("reservations/<int:reservation_id>/row/", views.reservation_row, name="reservation-row"),
    path("reservations/<int:reservation_id>/release/", views.reservation_release, name="reservation-release"),
    path("reservations/<int:reservation_id>/extend/", views.reservation_extend, name="reservation-extend"),
    path("reservations/<int:reservation_id>/keep/", views.reservation_keep, name="reservation-keep"),
    path("teams/<slug:slug>/", views.team_detail, name="team"),
    path("preferences/", preferences.preferences, name="preferences"),
    path("language/", preferences.switch_language, name="language"),
    path("tokens/", tokens.tokens, name="tokens"),
    path("tokens/revoke/", tokens.token_revoke, name="token-revoke"),
    path("notifications/", channels.channels, name="channels"),
    path("notifications/<int:channel_id>/<str:action>/", channels.channel_action, name="channel-action"),
    path("audit/", views.audit_log, name="audit"),
    path("pools/<slug:slug>/queue/", views.pool_queue, name="pool-queue"),
    path("login/", auth_views.LoginView.as_view(redirect_authenticated_user=True), name="login"),
    path("logout/", auth_views.LogoutView.as_view(), name="logout"),
    # Single sign-on (teams/oidc.py): /oidc/authenticate/ and /oidc/callback/, off until configured.
    path("oidc/", include("mozilla_django_oidc.urls")),
    path("", include("monitoring.urls")),
    path("", include("accounting.urls")),
    path("admin/", admin.site.urls),
    # Namespaced: the router's names (reservation-release, ...) must not shadow the pages'.
    path("api/v1/", include((api, "api"), namespace="api")),
    path("healthz", health.healthz, name="healthz"),
    path("readyz", health.readyz, name="readyz"),
    path("metrics", metrics.metrics, name="metrics"),
    # Kubernetes admission webhooks (called by API servers; CSRF-exempt, token-checked): see allocations/webhooks.py
    path("webhooks/kubernetes/", include(kube_webhooks)),
]
