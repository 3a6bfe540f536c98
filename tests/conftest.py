"""Shared fixtures: a small fleet, the personas (owner, member, outsider, staff) and API clients."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
from django.core.cache import cache
from django.db import connections
from django.utils import translation
from rest_framework.test import APIClient

from common import agent_threads
from inventory.models import GpuPool
from monitoring import gather
from teams.models import Membership, Team
from tests.factories import MembershipFactory, PoolFactory, QuotaFactory, TeamFactory, UserFactory, add_node
from tests.smtp import start_smtp

BASE_DIR = Path(__file__).resolve().parent.parent


def pytest_configure(config):
    from django.conf import settings

    # The real hasher costs ~0.3 s per password on this machine; tests make many users.
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
    # Pages name static files by their plain names (config.static), served fresh from the source folders:
    # never from a checkout's staticfiles/ that `make run` collected before the last change. The servers
    # the tests start inherit it.
    os.environ["STATIC_ROOT"] = settings.STATIC_ROOT = tempfile.mkdtemp(prefix="gpupool-static-")


@pytest.fixture(autouse=True)
def _fresh_cache():
    """Throttle counters live in the cache (Redis in the suite): start every test from zero. So do the pools'
    workload profiles, cached per process (a pool id a rolled-back test used may come back on SQLite)."""
    from allocations import profiles

    cache.clear()
    profiles.forget()
    yield


@pytest.fixture(autouse=True)
def _default_language():
    """Every test starts in the default language. Django's LocaleMiddleware and our PreferenceMiddleware activate
    a request's language for the thread and never put it back, so a test-client request by someone who reads
    Chinese left the next test of the same process reading Chinese (a test asserting English words failed
    in CI only when such a file had run before it on the same worker)."""
    translation.deactivate()
    yield
    translation.deactivate()


def _let_connection_go(barrier: threading.Barrier) -> None:
    connections.close_all()
    barrier.wait(timeout=5)  # so that each of the executor's threads runs one of these


@pytest.fixture(autouse=True)
def _background_threads_let_their_connections_go():
    """The WebSocket process's own database threads (the telemetry ingest's, the agents') keep a connection
    between calls, and a test's event loop can end before the ingest thread's quiet-time close runs: left
    open, the last one made pytest-django's teardown warn that the test database "is being accessed by
    other users" and leave it behind. Each thread that exists lets its connection go after every test."""
    yield
    for executor in (gather._INGEST_THREAD, agent_threads._executor):
        threads = len(executor._threads)
        if threads:
            barrier = threading.Barrier(threads)
            for future in [executor.submit(_let_connection_go, barrier) for _ in range(threads)]:
                future.result(timeout=10)


@dataclass
class World:
    pool: GpuPool
    other_pool: GpuPool
    team: Team
    other_team: Team
    owner: object  # the team's manager
    member: object
    outsider: object  # in another team, no rights on `team`
    staff: object


@pytest.fixture
def world(db) -> World:
    """Pool `a100` (2 nodes x 4 GPUs) and pool `l4` (1 node x 2 GPUs); team `ml` holds 6 GPUs of a100."""
    pool = PoolFactory(slug="a100", name="A100")
    other_pool = PoolFactory(slug="l4", name="L4")
    add_node(pool, "node-a", 4)
    add_node(pool, "node-b", 4)
    add_node(other_pool, "node-c", 2)
    team, other_team = TeamFactory(slug="ml", name="ML"), TeamFactory(slug="infra", name="Infra")
    QuotaFactory(team=team, pool=pool, max_ge=6)
    QuotaFactory(team=other_team, pool=pool, max_ge=8)
    QuotaFactory(team=other_team, pool=other_pool, max_ge=2)
    owner = UserFactory(username="owner")
    member = UserFactory(username="member")
    outsider = UserFactory(username="outsider")
    staff = UserFactory(username="staff", is_staff=True, is_superuser=True)
    MembershipFactory(user=owner, team=team, role=Membership.Role.MANAGER)
    MembershipFactory(user=member, team=team)
    MembershipFactory(user=outsider, team=other_team, role=Membership.Role.MANAGER)
    return World(pool, other_pool, team, other_team, owner, member, outsider, staff)


@pytest.fixture
def api():
    """api(user) → an APIClient signed in as that user (None: anonymous)."""

    def make(user=None) -> APIClient:
        client = APIClient()
        if user is not None:
            client.force_authenticate(user)
        return client

    return make


def _require_postgresql() -> None:
    from django.db import connection

    if connection.vendor != "postgresql":
        pytest.fail("integration and browser tests need PostgreSQL: run them with `make test` (DATABASE_URL)")


@pytest.fixture
def worker_env(transactional_db, tmp_path, settings):
    """Environment for processes that must share this test's database and Redis."""
    from django.db import connection

    _require_postgresql()
    if settings.EMBEDDED:
        pytest.fail("integration tests need Redis: set REDIS_URL (make test does)")
    db = connection.settings_dict
    database_url = f"postgres://{db['USER']}:{db['PASSWORD']}@{db['HOST']}:{db['PORT']}/{db['NAME']}"
    env = dict(os.environ, DATABASE_URL=database_url, REDIS_URL=settings.REDIS_URL, PORTAL_VAR_DIR=str(tmp_path),
               RESERVATION_SWEEP_SECONDS="1", PYTHONUNBUFFERED="1")
    return env


@pytest.fixture
def celery_worker_process(worker_env, tmp_path):
    """A real `celery worker -B` process (thread pool as the Procfile runs it, beat embedded) on this test's
    database and Redis."""
    import redis

    redis.Redis.from_url(worker_env["REDIS_URL"]).flushdb()  # no stale task from an earlier run
    process = start_server(
        [sys.executable, "-m", "celery", "-A", "config", "worker", "-B", "--pool=threads", "--concurrency=2",
         "--loglevel=INFO",
         "--without-mingle", "--without-gossip", "--schedule", str(tmp_path / "beat-schedule")],
        env=worker_env, log_path=tmp_path / "worker.log", what="the Celery worker",
        ready=lambda: b"ready." in (tmp_path / "worker.log").read_bytes(),
    )
    yield process
    stop_process_group(process)


def start_server(args: list[str], *, env: dict, log_path: Path, ready, what: str,
                 within: float = 60.0) -> subprocess.Popen:
    """Start a server process in its own process group and wait (`within` seconds at most) until `ready()`.

    Its own group, so everything it forks (beat, uvicorn workers) stops with it: an orphan
    would keep connections to the test database, which then could not be dropped.
    """
    with open(log_path, "wb") as log:
        process = subprocess.Popen(args, env=env, cwd=BASE_DIR, stdout=log, stderr=subprocess.STDOUT,
                                   start_new_session=True)
    process.log_path = log_path
    deadline = time.monotonic() + within
    while not ready():
        if process.poll() is not None or time.monotonic() > deadline:
            stop_process_group(process, timeout=5)
            pytest.fail(f"{what} did not start:\n" + log_path.read_text()[-3000:])
        time.sleep(0.2)
    return process


def healthz_answers(base_url: str):
    """A readiness check for start_server: the server at base_url answers /healthz with 200."""
    import httpx

    def answers() -> bool:
        try:
            return httpx.get(f"{base_url}/healthz", timeout=1).status_code == 200
        except httpx.HTTPError:
            return False

    return answers


def listening(port: int):
    """A readiness check for start_server: something accepts TCP connections on 127.0.0.1:port (a server over
    TLS, whose /healthz an HTTP client without its CA cannot ask)."""
    import socket

    def accepts() -> bool:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return True
        except OSError:
            return False

    return accepts


def free_port() -> int:
    """A TCP port nothing listens on now (the server started next binds it)."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def stop_process_group(process: subprocess.Popen, timeout: float = 15.0) -> None:
    """SIGTERM a process started with start_new_session=True and its whole group; SIGKILL what is left."""
    try:
        os.killpg(process.pid, signal.SIGTERM)
        process.wait(timeout=timeout)
    except (ProcessLookupError, subprocess.TimeoutExpired):
        pass
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    process.wait()


def wait_for(predicate, timeout: float = 20.0, interval: float = 0.2, message: str = "condition"):
    """Poll until predicate() is truthy; fail with `message` after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    pytest.fail(f"timed out after {timeout}s waiting for {message}")


# --- servers and browsers shared by the integration, monitoring and browser tests --------------

@pytest.fixture
def asgi_server(worker_env, tmp_path):
    """The real ASGI app under uvicorn (2 workers, Redis channel layer) on this test's database; yields its URL."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    process = start_server(
        [sys.executable, "-m", "uvicorn", "config.asgi:application", "--host", "127.0.0.1", "--port", str(port),
         "--workers", "2", "--lifespan", "off", "--log-level", "warning"],
        env=worker_env, log_path=tmp_path / "uvicorn.log", what="uvicorn", ready=healthz_answers(url),
    )
    yield url
    stop_process_group(process)


CHROMIUM = os.environ.get("CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run", "--disable-quic"]


def sign_in(page, url: str, username: str = "member") -> None:
    """Sign in through the login form (the factories' PASSWORD) and wait for the dashboard."""
    from tests.factories import PASSWORD

    page.goto(f"{url}/login/")
    page.fill("input[name=username]", username)
    page.fill("input[name=password]", PASSWORD)
    page.click("button[type=submit]")
    page.wait_for_url(f"{url}/")


@pytest.fixture
def page(tmp_path):
    """A headless Debian Chromium page driven by Playwright (no browser download: executable_path)."""
    if not Path(CHROMIUM).exists():
        pytest.fail(f"browser tests need Debian's chromium at {CHROMIUM} (scripts/test-services installs it)")
    # Playwright's sync API runs an event loop in this thread; the test still talks to the
    # database directly (fixtures, assertions), which Django would otherwise refuse.
    os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = "true"
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
        context = browser.new_context(viewport={"width": 1280, "height": 900})
        page = context.new_page()
        page.set_default_timeout(15000)
        yield page
        if os.environ.get("SCREENSHOTS"):
            page.screenshot(path=str(Path(os.environ["SCREENSHOTS"]) / "last.png"), full_page=True)
        context.close()
        browser.close()
        # Connections opened while Playwright's loop ran would outlive the test database.
        from django.db import connections

        connections.close_all()
    os.environ.pop("DJANGO_ALLOW_ASYNC_UNSAFE", None)


@pytest.fixture
def smtp(settings):
    """A real SMTP server (aiosmtpd) on a free port, and Django sending its mail there; yields the inbox."""
    inbox, controller, port = start_smtp()
    settings.EMAIL_BACKEND = "django.core.mail.backends.smtp.EmailBackend"
    settings.EMAIL_HOST, settings.EMAIL_PORT = "127.0.0.1", port
    settings.EMAIL_USE_TLS = settings.EMAIL_USE_SSL = False
    settings.EMAIL_HOST_USER = settings.EMAIL_HOST_PASSWORD = ""
    yield inbox
    controller.stop()
