"""`python -m config.web`: the HTTP server for the pages, the REST API and the agents' ingest
(the Procfile's `web`; the benchmarks and tests start it the same way).

Granian serves the WSGI app. It parses HTTP, keeps the connections alive and moves the
bytes in Rust, so a worker's Python time goes to Django alone. On our 2-core machine
/healthz under 32 keep-alive clients cost 1.16 ms of CPU per request with gunicorn's
threaded workers and 0.59 ms with Granian; the agents' telemetry ingest took 0.73 to 0.85
of a core instead of 0.97 for the same 10,000 samples a second.

Each worker process runs the app on a few threads, each holding at most one pooled
database connection: WEB_WORKERS x WEB_THREADS connections at most (see DB_POOL_MAX_SIZE).
On few cores, few threads: Python threads of one process take turns on one lock (the GIL),
and more of them only wait longer; two let one thread run while the other waits on
PostgreSQL or Redis.
"""
from __future__ import annotations

import argparse
import os
from pathlib import Path


def _env_int(name: str, default: int) -> int:
    value = os.environ.get(name, "")
    try:
        return int(value) if value else default
    except ValueError:
        raise SystemExit(f"{name} must be a whole number, not {value!r}") from None


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m config.web", description=__doc__.split("\n\n")[0])
    parser.add_argument("--host", default=os.environ.get("HOST", "127.0.0.1"))
    parser.add_argument("--port", type=int, default=_env_int("PORT", 8000))
    parser.add_argument("--workers", type=int, default=_env_int("WEB_WORKERS", (os.cpu_count() or 1) + 1),
                        help="processes (WEB_WORKERS; default: cores + 1)")
    parser.add_argument("--threads", type=int, default=_env_int("WEB_THREADS", 2),
                        help="threads per process running the app (WEB_THREADS; default 2)")
    parser.add_argument("--backlog", type=int, default=_env_int("WEB_BACKLOG", 2048))
    parser.add_argument("--access-log", action="store_true", default=os.environ.get("WEB_ACCESS_LOG") == "1",
                        help="log every request (WEB_ACCESS_LOG=1)")
    parser.add_argument("--log-level", default=os.environ.get("WEB_LOG_LEVEL", "info"))
    parser.add_argument("--ssl-certificate", default=os.environ.get("WEB_TLS_CERT") or None,
                        help="serve HTTPS with this certificate (WEB_TLS_CERT)")
    parser.add_argument("--ssl-keyfile", default=os.environ.get("WEB_TLS_KEY") or None,
                        help="its private key, PKCS#8 (WEB_TLS_KEY)")
    args = parser.parse_args(argv)
    if bool(args.ssl_certificate) != bool(args.ssl_keyfile):
        raise SystemExit("HTTPS needs both a certificate and its key (WEB_TLS_CERT and WEB_TLS_KEY)")

    from granian import Granian

    Granian(
        "config.wsgi:application", interface="wsgi", address=args.host, port=args.port, workers=args.workers,
        blocking_threads=args.threads, backlog=args.backlog, log_level=args.log_level, log_access=args.access_log,
        ssl_cert=Path(args.ssl_certificate) if args.ssl_certificate else None,
        ssl_key=Path(args.ssl_keyfile) if args.ssl_keyfile else None, respawn_failed_workers=True,
        # A worker stuck past this on shutdown is killed, so a deploy never hangs.
        workers_kill_timeout=30,
    ).serve()


if __name__ == "__main__":
    main()
