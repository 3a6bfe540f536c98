"""WSGI entry point: production serves the HTTP API and pages with Granian (`python -m config.web`)."""
import gc
import os

from django.core.wsgi import get_wsgi_application
from django.urls import get_resolver

from config.request_body import DrainUnreadBody

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
application = DrainUnreadBody(get_wsgi_application())
# The URLconf (and every view, serializer and API class it imports) now rather than on the first
# request, so that it is among what the next line freezes.
get_resolver().url_patterns
# Everything loaded so far (~160,000 objects) lives as long as the process: moved out of the garbage
# collector's sight, its collections scan only what requests make. Measured on the telemetry
# ingest: 0.55 -> 0.20 ms of collection per request.
gc.freeze()
