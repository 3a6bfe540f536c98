"""A person's language and time zone: the switcher, the saved preference, and which wins."""
from __future__ import annotations

import re

import pytest
from django.test import Client

from teams.models import Preference


@pytest.fixture
def signed_in(world):
    def make(user, **headers) -> Client:
        client = Client(**headers)
        client.force_login(user)
        return client

    return make


def _lang(response) -> str:
    return re.search(r'<html lang="([^"]+)"', response.content.decode()).group(1)


def test_the_browser_language_is_used_until_someone_chooses(world, signed_in):
    assert _lang(signed_in(world.member).get("/")) == "en"
    chinese = signed_in(world.member, HTTP_ACCEPT_LANGUAGE="zh-CN,zh;q=0.9,en;q=0.5").get("/")
    assert _lang(chinese) == "zh-hans" and "退出登录" in chinese.content.decode()
    assert chinese["Content-Language"] == "zh-hans"


def test_the_switcher_saves_the_choice_for_the_person_and_the_browser(world, signed_in):
    client = signed_in(world.member)
    answer = client.post("/language/", {"language": "zh-hans", "next": "/reservations/"})
    assert answer.status_code == 302 and answer["Location"] == "/reservations/"
    assert answer.cookies["django_language"].value == "zh-hans"
    assert Preference.objects.get(user=world.member).language == "zh-hans"
    # Another browser that asks for English still gets the person's choice.
    assert _lang(signed_in(world.member, HTTP_ACCEPT_LANGUAGE="en").get("/")) == "zh-hans"


def test_the_switcher_works_before_signing_in_and_only_redirects_home(world):
    client = Client()
    answer = client.post("/language/", {"language": "zh-hans", "next": "https://evil.example/"})
    assert answer["Location"] == "/"
    assert _lang(client.get("/login/")) == "zh-hans"
    assert not Preference.objects.exists()


def test_an_unknown_language_changes_nothing(world, signed_in):
    client = signed_in(world.member)
    answer = client.post("/language/", {"language": "fr"})
    assert answer.status_code == 302 and "django_language" not in answer.cookies
    assert not Preference.objects.exists()


def test_the_switcher_is_on_every_page_with_the_current_language_selected(world, signed_in):
    page = signed_in(world.member, HTTP_ACCEPT_LANGUAGE="zh-hans").get("/reservations/").content.decode()
    assert re.search(r'<option value="zh-hans" lang="zh-hans" selected>简体中文</option>', page)
    assert '<option value="en" lang="en">English</option>' in page
    assert 'name="next" value="/reservations/"' in page


def test_a_saved_time_zone_beats_the_browsers(world, signed_in):
    client = signed_in(world.member)
    client.cookies["tz"] = "Europe/Berlin"
    answer = client.post("/preferences/", {"language": "", "time_zone": "Asia/Shanghai"})
    assert answer.status_code == 302
    assert Preference.objects.get(user=world.member).time_zone == "Asia/Shanghai"
    assert 'id="page-zone"' in (page := client.get("/").content.decode())
    assert re.search(r'id="page-zone"[^>]*>Asia/Shanghai \(CST\)<', page)


def test_the_preferences_page_refuses_an_unknown_zone_and_keeps_nothing(world, signed_in):
    client = signed_in(world.member)
    answer = client.post("/preferences/", {"language": "zh-hans", "time_zone": "Mars/Olympus"})
    assert answer.status_code == 200
    assert 'data-field="time_zone"' in answer.content.decode()
    assert not Preference.objects.exists()


def test_saving_a_language_answers_in_it(world, signed_in):
    client = signed_in(world.member)
    answer = client.post("/preferences/", {"language": "zh-hans", "time_zone": ""}, follow=True)
    assert "偏好设置已保存。" in answer.content.decode()
    assert _lang(answer) == "zh-hans"


def test_outside_a_request_a_person_is_spoken_to_in_their_language_and_zone(world):
    from datetime import UTC, datetime

    from django.utils import timezone, translation

    from teams.preferences import speaking_to

    Preference.objects.create(user=world.member, language="zh-hans", time_zone="Asia/Shanghai")
    noon = datetime(2026, 11, 25, 12, 0, tzinfo=UTC)
    with speaking_to(world.member):
        assert translation.get_language() == "zh-hans"
        assert timezone.localtime(noon).hour == 20
    with speaking_to(world.owner):  # nothing saved: the portal's defaults
        assert translation.get_language() == "en" and timezone.localtime(noon).hour == 12
