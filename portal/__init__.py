"""GPU Pool Portal: project wiring (settings, urls, asgi, celery) plus teams, auth and pages."""
from portal.celery import app as celery_app

__all__ = ["celery_app"]
