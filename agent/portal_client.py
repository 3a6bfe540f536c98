"""The agent's side of the portal's agent API (HTTP + JSON, `Authorization: Host <token>`)."""
from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any


class PortalError(Exception):
    """The portal answered, but refused (4xx): retrying the same call will not help."""

    def __init__(self, status: int, body: str) -> None:
        super().__init__(f"portal answered {status}: {body[:500]}")
        self.status = status


class PortalUnreachable(Exception):
    """No answer, or a 5xx: worth retrying later."""


class PortalClient:
    def __init__(self, base_url: str, token: str, timeout: float = 10.0) -> None:
        self.base_url = base_url.rstrip("/")
        self.token = token
        self.timeout = timeout

    def _post(self, path: str, payload: dict[str, Any]) -> dict[str, Any]:
        request = urllib.request.Request(
            f"{self.base_url}{path}", data=json.dumps(payload).encode(), method="POST",
            headers={"Authorization": f"Host {self.token}", "Content-Type": "application/json",
                     "Accept": "application/json"},
        )
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as response:
                return json.loads(response.read() or b"{}")
        except urllib.error.HTTPError as error:
            body = error.read().decode(errors="replace")
            if error.code >= 500:
                raise PortalUnreachable(f"portal answered {error.code}") from error
            raise PortalError(error.code, body) from error
        except (urllib.error.URLError, TimeoutError, ConnectionError) as error:
            raise PortalUnreachable(str(error)) from error

    def register(self, *, hostname: str, backend: str, agent_version: str, gpus: list[dict]) -> dict[str, Any]:
        return self._post("/api/v1/agent/register/", {"hostname": hostname, "backend": backend,
                                                      "agent_version": agent_version, "gpus": gpus})

    def heartbeat(self) -> dict[str, Any]:
        return self._post("/api/v1/agent/heartbeat/", {})

    def leases(self, *, held: list[str], failed: dict[str, str] | None = None,
               unleased_in_use: list[str] | None = None) -> dict[str, Any]:
        return self._post("/api/v1/agent/leases/", {"held": held, "failed": failed or {},
                                                    "unleased_in_use": unleased_in_use or []})
