"""ASGI entry point: HTTP and WebSockets (Channels) from one app.

Production serves WebSockets from this app under uvicorn; the embedded demo serves
everything from it.
"""
import os

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
django_asgi_app = get_asgi_application()

from channels.auth import AuthMiddlewareStack  # noqa: E402  (needs Django set up first)
from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402
from django.urls import re_path  # noqa: E402

from config.routing import agent_urlpatterns, websocket_urlpatterns  # noqa: E402
from monitoring.ws_auth import BrowserOriginOrTokenValidator, TokenAuthMiddleware  # noqa: E402

application = ProtocolTypeRouter(
    {
        "http": django_asgi_app,
        "websocket": URLRouter([
            # Host agents authenticate with their Host key, in the consumer. Past the session stack, a socket
            # open costs no session store, no cookie parsing and no hop to Channels' one database thread for
            # an anonymous user: at 1,250 hosts opening two sockets each, that per-open work on the event
            # loop was a good part of what the ws process could not keep up with (py-spy, benchmarks.fleet).
            *agent_urlpatterns,
            # Browsers: session cookie + Origin check; scripts: `Authorization: Token …` (monitoring/ws_auth.py).
            re_path(r"", BrowserOriginOrTokenValidator(
                AuthMiddlewareStack(TokenAuthMiddleware(URLRouter(websocket_urlpatterns))))),
        ]),
    }
)
