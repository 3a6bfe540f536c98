"""`python manage.py runembedded`: the whole portal in one process, for the demo and for trying it out.

Migrates the SQLite database, loads the demo data on first start, starts a Celery
worker and beat on threads (in-memory broker), and serves the ASGI app with uvicorn.
Refuses to run with REDIS_URL set: production runs web, worker and beat as separate
processes (see the Procfile).
"""
from __future__ import annotations

import logging
import os
import threading
from pathlib import Path

from django.conf import settings
from django.utils import timezone
from django.contrib.auth import get_user_model
from django.core.exceptions import ValidationError
from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandError, CommandParser

from common.private_files import write_private
from config.demo import check_admin_password, load_demo
from config.demo_history import load_demo_history
from config.static import collected_is_current


def base_url(host: str, port: int) -> str:
    """The URL a person on this machine opens for a server bound to host:port (any-address: loopback)."""
    address = "127.0.0.1" if host in ("0.0.0.0", "::", "") else host
    return f"http://[{address}]:{port}" if ":" in address else f"http://{address}:{port}"


class Command(BaseCommand):
    help = "Run web, Celery worker and beat in one process with the embedded database and broker."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--host", default=os.environ.get("HOST", "127.0.0.1"))
        parser.add_argument("--port", type=int, default=int(os.environ.get("PORT", "8000")))
        parser.add_argument("--no-demo", action="store_true", help="Do not load demo data into an empty database")
        parser.add_argument("--no-agents", action="store_true",
                            help="Do not start the simulated host agents that feed the demo's live charts")

    def handle(self, *args, host: str, port: int, no_demo: bool, no_agents: bool = False, **options) -> None:
        if not settings.EMBEDDED:
            raise CommandError("runembedded is the embedded mode; unset REDIS_URL, or run the Procfile processes.")
        self._check_demo_admin_password()
        if not os.environ.get("PORTAL_BASE_URL"):
            # Mail links name the address served below (--host/--port may differ from PORT).
            settings.PORTAL_BASE_URL = base_url(host, port)
        call_command("migrate", interactive=False, verbosity=0)
        self._collect_static()
        self._demo(no_demo)
        self._start_celery()
        if not no_agents:
            self._start_demo_agents(host, port)
        self.stdout.write(self.style.SUCCESS(f"GPU Pool Portal on http://{host}:{port}/  (Ctrl-C stops)"))

        import uvicorn

        uvicorn.run("config.asgi:application", host=host, port=port, lifespan="off", log_level="info")

    def _collect_static(self) -> None:
        """Compressed, fingerprinted static files (config/static.py), collected again only after a change."""
        if collected_is_current():
            return
        self.stdout.write("Collecting static files (compressed and fingerprinted, once per change)...")
        call_command("collectstatic", interactive=False, verbosity=0)

    def _check_demo_admin_password(self) -> None:
        """Before anything starts: a weak DEMO_ADMIN_PASSWORD stops start-up with the validators' reasons."""
        password = os.environ.get("DEMO_ADMIN_PASSWORD")
        if not password:
            return
        try:
            check_admin_password(password)
        except ValidationError as refused:
            raise CommandError("DEMO_ADMIN_PASSWORD is refused by the password validators: "
                               + " ".join(refused.messages)
                               + " Choose a longer, uncommon one, or unset it for a generated password.") from None

    def _demo(self, skip: bool) -> None:
        credentials = Path(settings.VAR_DIR) / "demo-credentials.txt"
        if not skip and not get_user_model().objects.exists():
            created = load_demo(admin_password=os.environ.get("DEMO_ADMIN_PASSWORD") or None)
            # A few past months of use, so the Reports page and the statements have something to show.
            load_demo_history(timezone.now())
            write_private(credentials, "".join(f"{user} {password}\n" for user, password in created.items()))
        if credentials.exists():
            self.stdout.write("Demo accounts (user password), also in " + str(credentials) + ":")
            for line in credentials.read_text().splitlines():
                self.stdout.write("  " + line)

    def _start_demo_agents(self, host: str, port: int) -> None:
        """Simulated agents (config/demo_agents.py) on threads: they retry until the server below is up."""
        from config.demo_agents import start_demo_agents

        # Three agents post every second; keep their requests out of the access log.
        logging.getLogger("uvicorn.access").addFilter(lambda record: "/api/v1/agent/" not in record.getMessage())
        agents = start_demo_agents(base_url(host, port))
        if agents:
            self.stdout.write(f"{len(agents)} simulated host agent(s) stream live telemetry (SIMULATED GPUs)")
            from config.demo_users import start_demo_users

            start_demo_users()
            self.stdout.write("Simulated users (bob, carol) keep the L40S pool busy, with a queue: /pools/l40s/queue/")

    def _start_celery(self) -> None:
        from celery.beat import EmbeddedService

        from config.celery import app

        # Every 5-second sweep would log three INFO lines; keep the console for what matters.
        for name in ("celery.app.trace", "celery.worker.strategy", "celery.beat"):
            logging.getLogger(name).setLevel(logging.WARNING)
        # The in-memory broker lives in this process, so worker and beat must too.
        app.conf.broker_transport_options = {"polling_interval": 0.2}
        worker = app.WorkController(pool_cls="solo", concurrency=1, loglevel="INFO", without_heartbeat=True,
                                    without_mingle=True, without_gossip=True)
        threading.Thread(target=worker.start, name="celery-worker", daemon=True).start()
        EmbeddedService(app, thread=True, schedule_filename=settings.CELERY_BEAT_SCHEDULE_FILENAME).start()
