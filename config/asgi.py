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

from config.routing import websocket_urlpatterns  # noqa: E402
from monitoring.ws_auth import BrowserOriginOrTokenValidator, TokenAuthMiddleware  # noqa: E402

application = ProtocolTypeRouter(
    {
        "http": django_asgi_app,
        # Browsers: session cookie + Origin check; scripts: `Authorization: Token …` (monitoring/ws_auth.py).
        "websocket": BrowserOriginOrTokenValidator(
            AuthMiddlewareStack(TokenAuthMiddleware(URLRouter(websocket_urlpatterns)))),
    }
)
