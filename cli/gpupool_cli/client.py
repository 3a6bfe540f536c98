"""The REST client: one httpx.Client with the token, and the portal's refusals turned into exit codes
a script can rely on (ExitCode)."""
from __future__ import annotations

from enum import IntEnum

import click
import httpx

from gpupool_cli.i18n import _, accept_language


class ExitCode(IntEnum):
    """What `gpupool` exits with. 2 is click's own: a command line it could not parse."""

    OK = 0
    ERROR = 1
    USAGE = 2
    NOT_SIGNED_IN = 3  # no token, or the portal refused it (401)
    FORBIDDEN = 4  # 403: not your team, a read-only token
    NOT_FOUND = 5  # 404
    REFUSED = 6  # 409: no room, over quota, wrong state
    INVALID = 7  # 400: a field broke a rule
    UNREACHABLE = 8  # the portal did not answer, or answered 5xx
    ENDED = 9  # --wait: the reservation failed or ended before it was active
    TIMEOUT = 10  # --wait: not active within --timeout


_BY_STATUS = {400: ExitCode.INVALID, 401: ExitCode.NOT_SIGNED_IN, 403: ExitCode.FORBIDDEN,
              404: ExitCode.NOT_FOUND, 409: ExitCode.REFUSED}


class PortalError(click.ClickException):
    """A refusal or a failure, printed as the portal's words (field and rule kept) with its exit code."""

    def __init__(self, message: str, code: ExitCode, body: dict | None = None) -> None:
        super().__init__(message)
        self.exit_code = int(code)
        self.body = body or {}


def _refusal(response: httpx.Response) -> PortalError:
    try:
        body = response.json()
    except ValueError:
        body = {}
    errors = body.get("errors") or []
    if errors:
        message = "; ".join(f"{e.get('message')} [{e['field'] + ': ' if e.get('field') else ''}{e.get('rule')}]"
                            for e in errors)
    else:
        message = body.get("detail") or f"HTTP {response.status_code}"
    code = _BY_STATUS.get(response.status_code,
                          ExitCode.UNREACHABLE if response.status_code >= 500 else ExitCode.ERROR)
    return PortalError(message, code, body)


class Portal:
    def __init__(self, url: str, token: str | None, timeout: float = 30.0) -> None:
        self.url = url.rstrip("/")
        # The portal answers in the CLI's language (its error messages; field and rule stay English codes).
        headers = {"Accept": "application/json", "Accept-Language": accept_language(), "User-Agent": "gpupool-cli"}
        if token:
            headers["Authorization"] = f"Token {token}"
        self.token = token
        self.http = httpx.Client(base_url=f"{self.url}/api/v1", headers=headers, timeout=timeout)

    def call(self, method: str, path: str, *, json: dict | None = None, params: dict | None = None,
             expect_json: bool = True):
        try:
            response = self.http.request(method, path, json=json,
                                         params={k: v for k, v in (params or {}).items() if v is not None})
        except httpx.HTTPError as error:
            raise PortalError(_("The portal at %(url)s did not answer: %(error)s") % {"url": self.url, "error": error},
                              ExitCode.UNREACHABLE) from error
        if response.status_code >= 400:
            raise _refusal(response)
        if not expect_json or response.status_code == 204:
            return None
        return response.json()

    def get(self, path: str, **params):
        return self.call("GET", path, params=params)

    def post(self, path: str, body: dict | None = None):
        return self.call("POST", path, json=body or {})

    def every(self, path: str, **params) -> list[dict]:
        """All results of a paged list (limit/offset; count, next, results)."""
        rows: list[dict] = []
        offset = 0
        while True:
            page = self.get(path, limit=200, offset=offset, **params)
            rows.extend(page["results"])
            offset += len(page["results"])
            if not page.get("next") or not page["results"]:
                return rows
