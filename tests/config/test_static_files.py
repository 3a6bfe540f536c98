"""Production static files: collected, compressed and fingerprinted, so Plotly (1.4 MB) goes out gzipped
(Brotli too where the package is installed) and is cached for a year under a name that changes with it."""
from __future__ import annotations

import gzip
import re

import pytest
from django.contrib.staticfiles.storage import staticfiles_storage
from django.core.management import call_command
from django.test import Client

from config.static import collected_is_current

YEAR = "max-age=315360000"


@pytest.fixture
def collected(settings, tmp_path):
    settings.STATIC_ROOT = str(tmp_path / "static")  # resets staticfiles_storage (setting_changed)
    assert not collected_is_current()
    call_command("collectstatic", interactive=False, verbosity=0)
    assert collected_is_current()
    return tmp_path / "static"


def test_pages_name_fingerprinted_files_and_plotly_goes_out_compressed_for_a_year(world, collected):
    client = Client()  # a fresh handler: WhiteNoise reads the collected folder when it starts
    client.force_login(world.member)
    page = client.get("/pools/a100/").content.decode()
    plotly = re.search(r'src="(/static/js/plotly-cartesian-3\.4\.0\.min\.[0-9a-f]{12}\.js)"', page)
    assert plotly, "the pool page names Plotly by its fingerprinted name"
    assert re.search(r'href="/static/css/portal\.[0-9a-f]{12}\.css"', page)
    assert plotly.group(1) == staticfiles_storage.url("js/plotly-cartesian-3.4.0.min.js")

    response = client.get(plotly.group(1), HTTP_ACCEPT_ENCODING="gzip, deflate, br")
    assert response.status_code == 200
    assert response["Content-Encoding"] in ("gzip", "br")
    assert YEAR in response["Cache-Control"] and "immutable" in response["Cache-Control"]
    body = b"".join(response.streaming_content)
    assert len(body) < 700_000  # of 1.4 MB
    if response["Content-Encoding"] == "gzip":
        assert gzip.decompress(body).startswith(b"/**")

    # A browser that takes no compression still gets the file, as it is.
    plain = client.get(plotly.group(1))
    assert "Content-Encoding" not in plain and int(plain["Content-Length"]) > 1_300_000


def test_collectstatic_is_not_needed_to_serve_pages(world):
    client = Client()
    client.force_login(world.member)
    page = client.get("/pools/a100/").content.decode()
    assert 'src="/static/js/plotly-cartesian-3.4.0.min.js"' in page
    assert client.get("/static/js/plotly-cartesian-3.4.0.min.js").status_code == 200
