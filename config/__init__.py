"""The project wiring: settings, URLs, the ASGI/WSGI apps and their servers, the Celery app, the embedded demo.

The one package that reaches into every app; no app imports it (.importlinter).
"""
from config.celery import app as celery_app

__all__ = ["celery_app"]
