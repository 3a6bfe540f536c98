"""WebSocket routes of every app (the live telemetry consumers join here)."""
websocket_urlpatterns: list = []
