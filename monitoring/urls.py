from django.urls import path

from monitoring import views

app_name = "monitoring"

urlpatterns = [
    path("pools/<slug:slug>/", views.pool_live, name="pool"),
    path("nodes/<int:node_id>/", views.node_live, name="node"),
    path("telemetry/", views.telemetry_sources, name="telemetry_sources"),
]
