"""Links in mails name the address the portal serves on: PORTAL_BASE_URL, else this machine on PORT."""
from __future__ import annotations

import os
import subprocess
import sys

from config.management.commands.runembedded import base_url
from tests.conftest import BASE_DIR

# In a fresh process, as `make run` starts it: the settings' base URL and an alert mail's link.
PROBE = ("import django; django.setup(); from django.conf import settings; from monitoring.alerts import alert_link; "
         "from monitoring.models import Alert; print(settings.PORTAL_BASE_URL); print(alert_link(Alert()))")


def _embedded(tmp_path, **extra) -> list[str]:
    env = {key: value for key, value in os.environ.items()
           if key not in ("DATABASE_URL", "REDIS_URL", "PORTAL_BASE_URL", "PORT")}
    env.update(DJANGO_SETTINGS_MODULE="config.settings", PORTAL_VAR_DIR=str(tmp_path / "var"), **extra)
    done = subprocess.run([sys.executable, "-c", PROBE], cwd=BASE_DIR, env=env, capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout.split()


def test_without_portal_base_url_links_name_the_port_served(tmp_path):
    assert _embedded(tmp_path, PORT="8765") == ["http://127.0.0.1:8765", "http://127.0.0.1:8765/"]


def test_portal_base_url_wins_when_set(tmp_path):
    assert _embedded(tmp_path, PORT="8765", PORTAL_BASE_URL="https://gpu.example.org/") == [
        "https://gpu.example.org", "https://gpu.example.org/"]


def test_runembedded_names_the_address_it_binds():
    assert base_url("127.0.0.1", 8765) == "http://127.0.0.1:8765"
    assert base_url("0.0.0.0", 9000) == "http://127.0.0.1:9000"
    assert base_url("::1", 9000) == "http://[::1]:9000"
    assert base_url("portal.lan", 80) == "http://portal.lan:80"
