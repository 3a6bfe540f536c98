"""With collected static files (a release, or `make run`), a browser fetches Plotly once, compressed, and
takes it from its cache on every later page: a second visit to a pool page loads nothing static again."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest
from django.test import Client

from tests.conftest import BASE_DIR

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

# The page's scripts and style sheets (the favicon is fetched when the browser gets to it, on either visit).
STATIC = ("performance.getEntriesByType('resource')"
          ".filter(r => r.name.includes('/static/') && !r.name.includes('/favicon.'))"
          ".map(r => ({name: r.name.split('/').pop(), transferred: r.transferSize, encoded: r.encodedBodySize}))")


@pytest.fixture
def collected(tmp_path, monkeypatch):
    """Static files collected as production has them; set before the server starts, so it serves them."""
    folder = tmp_path / "static"
    subprocess.run([sys.executable, "manage.py", "collectstatic", "--noinput", "-v0"], cwd=BASE_DIR, check=True,
                   env=dict(os.environ, STATIC_ROOT=str(folder)), timeout=300)
    monkeypatch.setenv("STATIC_ROOT", str(folder))
    return folder


def test_a_second_pool_visit_takes_plotly_from_the_browsers_cache(world, collected, asgi_server, page):
    client = Client()
    client.force_login(world.member)
    page.context.add_cookies([{"name": "sessionid", "value": client.cookies["sessionid"].value, "url": asgi_server}])
    page.goto(f"{asgi_server}/pools/a100/")
    first = {r["name"]: r for r in page.evaluate(STATIC)}
    plotly = next(name for name in first if name.startswith("plotly-cartesian-3.4.0.min."))
    assert plotly != "plotly-cartesian-3.4.0.min.js"  # fingerprinted
    assert 0 < first[plotly]["transferred"] < 700_000  # compressed on the wire (1.4 MB as it is)

    page.goto(f"{asgi_server}/reservations/")
    page.goto(f"{asgi_server}/pools/a100/")
    again = {r["name"]: r for r in page.evaluate(STATIC)}
    assert set(again) == set(first)
    assert {name: r["transferred"] for name, r in again.items()} == dict.fromkeys(again, 0)  # all from the cache
