"""The header takes staff to every team's page, and names the reservations list for what it holds."""
from __future__ import annotations

import re

import pytest
from django.test import Client

from tests.factories import TeamFactory


@pytest.fixture
def browser(world):
    def make(user) -> Client:
        client = Client()
        client.force_login(user)
        return client

    return make


def _nav(page: str) -> str:
    return re.search(r"<nav>.*?</nav>", page, re.S).group(0)


def test_staff_nav_links_every_teams_page(world, browser):
    TeamFactory(slug="audio", name="Audio")
    nav = _nav(browser(world.staff).get("/").content.decode())
    for slug in ("ml", "infra", "audio"):
        assert f'href="/teams/{slug}/"' in nav
    assert "<summary>Teams</summary>" in nav  # more than two: one menu, so the header stays one line


def test_a_member_sees_only_their_teams(world, browser):
    nav = _nav(browser(world.member).get("/").content.decode())
    assert 'href="/teams/ml/"' in nav and 'href="/teams/infra/"' not in nav
    assert ">Team ML<" in nav


def test_staff_see_all_reservations_not_my_reservations(world, browser):
    page = browser(world.staff).get("/reservations/").content.decode()
    assert "<h1>All reservations</h1>" in page and "<title>All reservations" in page
    assert ">All reservations<" in _nav(page) and "My reservations" not in page


def test_members_see_my_reservations(world, browser):
    page = browser(world.member).get("/reservations/").content.decode()
    assert "<h1>My reservations</h1>" in page and ">My reservations<" in _nav(page)
    assert "All reservations" not in page
