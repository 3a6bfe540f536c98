"""A WSGI middleware that leaves no unread request body on a kept-alive connection.

HTTP/1.1 lets a client send its next request on the same connection once the response has
come, so a server must read (drain) what is left of a request body its application did not
read, or close the connection after the response (RFC 9112 §9.3 / §6.3). Django answers many
requests without reading their body (403 before the view parses, 401 at authentication, a 409
from the state, a 413 on Content-Length alone), and Granian then dropped the connection under
the client's next request ("Server disconnected without sending a response").

After the application has answered, what is left of the body is read and thrown away when it
is at most DRAIN_LIMIT bytes (cheap: small JSON bodies); a bigger rest is not worth receiving,
so the response carries `Connection: close` and the server ends the connection after it.
"""
from __future__ import annotations

DRAIN_LIMIT = 1024 * 1024
_CHUNK = 64 * 1024


class _CountingInput:
    """wsgi.input, counting the bytes the application reads."""

    def __init__(self, stream) -> None:
        self.stream = stream
        self.consumed = 0

    def read(self, size: int = -1) -> bytes:
        data = self.stream.read() if size is None or size < 0 else self.stream.read(size)
        self.consumed += len(data)
        return data

    def readline(self, size: int = -1) -> bytes:
        data = self.stream.readline() if size is None or size < 0 else self.stream.readline(size)
        self.consumed += len(data)
        return data

    def readlines(self, hint: int = -1) -> list[bytes]:
        lines = self.stream.readlines() if hint is None or hint < 0 else self.stream.readlines(hint)
        self.consumed += sum(map(len, lines))
        return lines

    def __iter__(self):
        return iter(self.readline, b"")

    def drain(self, limit: int, declared: int | None) -> bool:
        """Read what is left of the body if it is at most `limit` bytes; False when more is left."""
        if declared is not None:
            left = declared - self.consumed
            if left > limit:
                return False
            while left > 0:
                data = self.stream.read(min(left, _CHUNK))
                if not data:
                    break
                left -= len(data)
            return True
        # No Content-Length (chunked): read to the end, but no more than `limit` bytes.
        budget = limit + 1
        while budget > 0:
            data = self.stream.read(min(budget, _CHUNK))
            if not data:
                return True
            budget -= len(data)
        return False


def _declared_length(environ) -> int | None:
    try:
        return max(0, int(environ.get("CONTENT_LENGTH") or 0)) if environ.get("CONTENT_LENGTH") else None
    except ValueError:
        return None


class DrainUnreadBody:
    def __init__(self, application, limit: int = DRAIN_LIMIT) -> None:
        self.application = application
        self.limit = limit

    def __call__(self, environ, start_response):
        declared = _declared_length(environ)
        chunked = "chunked" in environ.get("HTTP_TRANSFER_ENCODING", "").lower()
        if not declared and not chunked:
            return self.application(environ, start_response)
        body = environ["wsgi.input"] = _CountingInput(environ["wsgi.input"])
        answer: list = []

        def held_start_response(status, headers, exc_info=None):
            answer[:] = [status, headers, exc_info]
            return lambda data: None  # the write() callable; Django never uses it

        result = self.application(environ, held_start_response)
        status, headers, exc_info = answer
        if not body.drain(self.limit, None if chunked else declared):
            headers = [(k, v) for k, v in headers if k.lower() != "connection"] + [("Connection", "close")]
        start_response(status, headers, exc_info)
        return result
