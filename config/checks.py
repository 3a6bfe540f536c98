"""Deployment checks of our own settings, shown by `manage.py check --deploy` beside Django's."""
from __future__ import annotations

from django.conf import settings
from django.core.checks import Tags, Warning, register


@register(Tags.security, deploy=True)
def metrics_access(app_configs, **kwargs) -> list[Warning]:
    if settings.METRICS_TOKEN or settings.METRICS_PUBLIC:
        return []
    return [Warning("/metrics answers 403 to everyone: METRICS_TOKEN is not set.",
                    hint="Set METRICS_TOKEN and scrape with `Authorization: Bearer <METRICS_TOKEN>`, or set "
                         "METRICS_PUBLIC=true where the ingress protects /metrics.", id="portal.W001")]


@register(Tags.staticfiles, deploy=True)
def static_files_collected(app_configs, **kwargs) -> list[Warning]:
    from django.contrib.staticfiles.storage import staticfiles_storage

    if not hasattr(staticfiles_storage, "manifest_exists") or staticfiles_storage.manifest_exists():
        return []
    return [Warning("Static files are not collected: pages name them by their plain names, uncompressed and "
                    "cached for 60 s (Plotly is 1.4 MB).",
                    hint="Run `python manage.py collectstatic --noinput` with each release, beside migrate.",
                    id="portal.W002")]
