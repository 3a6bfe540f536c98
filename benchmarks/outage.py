"""What API clients see while Redis or PostgreSQL is down: `python -m benchmarks.outage --service postgres`.

Starts a PostgreSQL and a Redis of its own (tests/outages.py: needs the server binaries
scripts/test-services installs), migrates and seeds the database, starts the web server as the
Procfile does (`python -m config.web`, --workers processes x 2 threads), and runs --clients
keep-alive clients listing reservations with a token. After --up seconds it stops the service
(kill / `pg_ctl -m immediate`, as a crash), after --down seconds starts it again, and after
--up more seconds prints the statuses and latencies before, during and after, and how long
after the service was back the last non-200 answer came.
"""
from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# A member with a quota and an API token in a fresh database (run by `manage.py shell -c`); the outage
# test seeds its private PostgreSQL with it too.
SEED = """
from teams.services import api_token_create
from tests.factories import MembershipFactory, PoolFactory, QuotaFactory, TeamFactory, UserFactory, add_node
pool = PoolFactory(slug="a100")
add_node(pool, "node-a", 4)
team = TeamFactory(slug="ml")
QuotaFactory(team=team, pool=pool, max_ge=4)
member = UserFactory(username="member")
MembershipFactory(user=member, team=team)
print("TOKEN", api_token_create(user=member)[1])
"""


def _latency(records: list[tuple[float, float, int]]) -> str:
    if not records:
        return "none"
    ms = sorted(seconds * 1000 for _, seconds, _ in records)
    statuses = {s: sum(1 for *_, r in records if r == s) for s in sorted({r for *_, r in records})}
    return (f"{len(ms)} requests {statuses}, p50 {ms[len(ms) // 2]:.0f} ms, p99 {ms[int(len(ms) * 0.99)]:.0f} ms, "
            f"max {ms[-1]:.0f} ms")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.outage", description=__doc__.split("\n\n")[0])
    parser.add_argument("--service", choices=["redis", "postgres"], required=True)
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--workers", type=int, default=3)
    parser.add_argument("--up", type=float, default=3.0)
    parser.add_argument("--down", type=float, default=5.0)
    args = parser.parse_args(argv)
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
    os.environ.setdefault("SECRET_KEY", "bench-only")
    os.environ.setdefault("REDIS_URL", "redis://127.0.0.1:6379/13")
    import django

    django.setup()
    import httpx

    from tests.conftest import free_port
    from tests.outages import PostgresServer, RedisServer

    postgres, redis_server, web = PostgresServer(), RedisServer(), None
    try:
        postgres.start()
        postgres.create_database()
        redis_server.start()
        env = dict(os.environ, DATABASE_URL=postgres.url, REDIS_URL=redis_server.url(), PORTAL_VAR_DIR=str(postgres.dir))
        subprocess.run([sys.executable, "manage.py", "migrate", "-v0"], env=env, cwd=ROOT, check=True)
        seeded = subprocess.run([sys.executable, "manage.py", "shell", "-c", SEED], env=env, cwd=ROOT, check=True,
                                capture_output=True, text=True).stdout
        token = next(line.split()[1] for line in seeded.splitlines() if line.startswith("TOKEN "))
        port = free_port()
        base = f"http://127.0.0.1:{port}"
        web = subprocess.Popen([sys.executable, "-m", "config.web"], cwd=ROOT, start_new_session=True,
                               env=dict(env, WEB_WORKERS=str(args.workers), WEB_THREADS="2", PORT=str(port)),
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(f"{base}/healthz", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                if time.monotonic() > deadline:
                    raise SystemExit("the web server did not start") from None
            time.sleep(0.2)

        records: list[tuple[float, float, int]] = []
        stop = threading.Event()

        def client() -> None:
            with httpx.Client(base_url=base, headers={"Authorization": f"Token {token}"}, timeout=30) as http:
                while not stop.is_set():
                    started = time.monotonic()
                    try:
                        status = http.get("/api/v1/reservations/").status_code
                    except httpx.HTTPError:
                        status = -1
                    records.append((started, time.monotonic() - started, status))

        threads = [threading.Thread(target=client) for _ in range(args.clients)]
        for thread in threads:
            thread.start()
        service = postgres if args.service == "postgres" else redis_server
        time.sleep(args.up)
        down_at = time.monotonic()
        service.stop()
        time.sleep(args.down)
        service.start()
        up_at = time.monotonic()
        time.sleep(args.up)
        stop.set()
        for thread in threads:
            thread.join()

        print(f"{args.service} down for {args.down:g} s; {args.clients} clients, {args.workers} web workers x 2 threads")
        print("before:", _latency([r for r in records if r[0] < down_at]))
        print("during:", _latency([r for r in records if down_at + 0.5 < r[0] < up_at]))
        after = [r for r in records if r[0] >= up_at]
        print("after: ", _latency(after))
        bad = [start + seconds - up_at for start, seconds, status in after if status != 200]
        print(f"last non-200 answer {max(bad):.2f} s after the service was back" if bad else
              "every answer after the service was back was 200")
    finally:
        if web is not None:
            os.killpg(web.pid, signal.SIGTERM)
            web.wait()
        redis_server.close()
        postgres.close()


if __name__ == "__main__":
    main()
