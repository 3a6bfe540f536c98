"""The pages render for each persona, and a refused form says why next to the field."""
from __future__ import annotations

from datetime import timedelta

import pytest
from django.test import Client
from django.utils import timezone

from allocations.models import Reservation
from portal import timezones
from tests.factories import window


@pytest.fixture
def browser(world):
    def make(user) -> Client:
        client = Client()
        client.force_login(user)
        return client

    return make


def local(dt) -> str:
    return timezone.localtime(dt).strftime("%Y-%m-%dT%H:%M")


def test_the_dashboard_shows_pools_with_free_counts_and_my_reservations(world, browser, api):
    _, end = window(0, 2)
    api(world.member).post("/api/v1/reservations/", {"pool": "a100", "team": "ml", "gpus": 3,
                                                     "ends_at": end.isoformat()}, format="json")
    page = browser(world.member).get("/").content.decode()
    assert "A100" in page and ">5<" in page  # 8 GPUs, 3 allocated → 5 free
    # No quota there. Matched as the pool's name in the page's text: a bare "L4" also turned up inside the
    # random CSRF token now and then.
    assert ">L4<" not in page and 'href="/pools/l4/"' not in page
    assert "node-a:0" in page


def test_the_reserve_form_books_gpus_and_redirects(world, browser):
    client = browser(world.member)
    response = client.post("/reserve/", {"team": "ml", "pool": "a100", "gpus": 2, "starts_at": "",
                                         "ends_at": local(timezone.now() + timedelta(hours=3))})
    assert response.status_code == 302
    assert Reservation.objects.get().gpus == 2
    assert "Reserved 2 GPUs of A100" in client.get("/reservations/").content.decode()


def test_a_refused_form_shows_the_reason_next_to_the_field(world, browser):
    response = browser(world.member).post("/reserve/", {
        "team": "ml", "pool": "a100", "gpus": 7, "ends_at": local(timezone.now() + timedelta(hours=3))})
    assert response.status_code == 400
    page = response.content.decode()
    assert 'data-field="gpus"' in page and "Over quota" in page
    assert not Reservation.objects.exists()


def test_the_reserve_page_shows_the_availability_timeline(world, browser):
    page = browser(world.member).get("/reserve/?pool=a100").content.decode()
    assert "When A100 has free GPUs" in page
    assert page.count('class="slot"') == 24


def test_the_availability_partial_changes_range(world, browser):
    page = browser(world.member).get("/reserve/availability/?pool=a100&range=7d").content.decode()
    assert page.count('class="slot"') == 28
    refused = browser(world.member).get("/reserve/availability/?pool=l4").content.decode()
    assert "not one you can reserve from" in refused


def test_release_and_extend_from_my_reservations(world, browser):
    client = browser(world.member)
    client.post("/reserve/", {"team": "ml", "pool": "a100", "gpus": 1,
                              "ends_at": local(timezone.now() + timedelta(hours=2))})
    reservation = Reservation.objects.get()
    new_end = timezone.now() + timedelta(hours=5)
    client.post(f"/reservations/{reservation.pk}/extend/", {"ends_at": local(new_end)})
    reservation.refresh_from_db()
    assert local(reservation.ends_at) == local(new_end)
    client.post(f"/reservations/{reservation.pk}/release/", {"confirm": "yes"})
    reservation.refresh_from_db()
    assert reservation.state in ("releasing", "released")


def test_outsiders_get_404_for_another_teams_reservation_page(world, browser, api):
    _, end = window(0, 2)
    rid = api(world.member).post("/api/v1/reservations/", {"pool": "a100", "team": "ml", "gpus": 1,
                                                           "ends_at": end.isoformat()}, format="json").json()["id"]
    assert browser(world.member).get(f"/reservations/{rid}/").status_code == 200
    assert browser(world.outsider).get(f"/reservations/{rid}/").status_code == 404
    assert browser(world.outsider).post(f"/reservations/{rid}/release/").status_code == 404


def test_the_team_page_shows_quota_use_and_lets_managers_add_members(world, browser):
    page = browser(world.member).get("/teams/ml/").content.decode()
    assert "Quota use" in page and "Add member" not in page
    owner = browser(world.owner)
    assert "Add member" in owner.get("/teams/ml/").content.decode()
    response = owner.post("/teams/ml/", {"username": "outsider", "role": "member"})
    assert response.status_code == 302
    assert world.team.memberships.filter(user=world.outsider).exists()
    assert browser(world.member).get("/teams/infra/").status_code == 404


def test_admin_is_reachable_for_staff_only(world, browser):
    assert browser(world.staff).get("/admin/allocations/quota/").status_code == 200
    assert browser(world.member).get("/admin/").status_code == 302


def test_the_availability_timeline_at_the_end_of_the_calendar_says_why(world, browser):
    page = browser(world.member).get("/reserve/availability/?pool=a100&start=9999-12-31T12:00")
    assert page.status_code == 200 and "Start before 9000-01-01" in page.content.decode()


def test_the_live_reservations_come_in_pages(world, browser):
    """Staff see the whole fleet's live reservations: 50 to a page, never one page of thousands."""
    start = timezone.now() + timedelta(hours=1)
    Reservation.objects.bulk_create(
        Reservation(team=world.team, pool=world.pool, requested_by=world.member, gpus=1,
                    starts_at=start + timedelta(hours=i), ends_at=start + timedelta(hours=i, minutes=30),
                    state=Reservation.State.SCHEDULED)
        for i in range(62)
    )
    client = browser(world.staff)
    first = client.get("/reservations/").content.decode()
    assert first.count('<tr id="reservation-') == 50
    assert "1–50 of 62" in first and 'rel="next"' in first and 'rel="prev"' not in first
    second = client.get("/reservations/?page=2").content.decode()
    assert second.count('<tr id="reservation-') == 12 and "51–62 of 62" in second and 'rel="prev"' in second
    # The earliest first, the latest on the last page.
    assert timezones.window(start, start + timedelta(minutes=30)) in first
    for junk in ("abc", "99", "-1", "0"):
        assert client.get(f"/reservations/?page={junk}").status_code == 200


def test_a_release_after_the_window_ended_says_it_expires(world, browser, api):
    _, end = window(0, 2)
    rid = api(world.member).post("/api/v1/reservations/", {"pool": "a100", "team": "ml", "gpus": 1,
                                                           "ends_at": end.isoformat()}, format="json").json()["id"]
    ended = timezone.now() - timedelta(minutes=1)
    Reservation.objects.filter(pk=rid).update(starts_at=ended - timedelta(hours=1), ends_at=ended)
    Reservation.objects.get(pk=rid).allocations.update(starts_at=ended - timedelta(hours=1), ends_at=ended)
    page = browser(world.member).post(f"/reservations/{rid}/release/", {"confirm": "yes"},
                                      follow=True).content.decode()
    assert f"Reservation #{rid} had already ended; it expires now." in page
    assert Reservation.objects.get(pk=rid).state == Reservation.State.EXPIRED


def test_my_reservations_filter_with_the_apis_filters_and_keep_them_across_pages(world, browser, api):
    start = timezone.now() + timedelta(hours=1)
    Reservation.objects.bulk_create(
        Reservation(team=team, pool=world.pool, requested_by=world.staff, gpus=1,
                    starts_at=start + timedelta(hours=i), ends_at=start + timedelta(hours=i, minutes=30),
                    state=Reservation.State.SCHEDULED)
        for i in range(60) for team in (world.team, world.other_team)
    )
    client = browser(world.staff)
    page = client.get("/reservations/?team=infra&state=scheduled").content.decode()
    api_count = api(world.staff).get("/api/v1/reservations/?team=infra&state=scheduled").json()["count"]
    assert "1–50 of 60" in page and api_count == 60
    assert 'href="?team=infra&amp;state=scheduled&amp;page=2"' in page
    assert '<option value="infra" selected>' in page and '<option value="scheduled" selected>' in page
    second = client.get("/reservations/?team=infra&state=scheduled&page=2").content.decode()
    assert second.count('<tr id="reservation-') == 10
    assert client.get("/reservations/?state=active").content.decode().count('<tr id="reservation-') == 0


def test_a_filter_value_the_api_would_refuse_is_named_on_the_page(world, browser):
    page = browser(world.member).get("/reservations/?state=sleeping").content.decode()
    assert 'role="alert">state: Select a valid choice. sleeping is not one of the available choices.' in page


def test_members_can_filter_only_by_their_own_teams(world, browser, api):
    api(world.outsider).post("/api/v1/reservations/", {"pool": "a100", "team": "infra", "gpus": 1,
                                                       "ends_at": window(0, 2)[1].isoformat()}, format="json")
    page = browser(world.member).get("/reservations/?team=infra").content.decode()
    assert '<option value="infra"' not in page and '<tr id="reservation-' not in page


def test_the_team_page_and_the_dashboard_show_use_in_ge_by_mode_and_model(world, browser):
    from tests.allocations.grants import A100, L4, mixed_grants

    mixed_grants(world)
    world.team.max_ge = 10
    world.team.save()
    page = browser(world.member).get("/teams/ml/").content.decode()
    facts = page.split('id="team-ge"')[1].split("</dl>")[0]
    held = 2 * 2.0 + 3 * 0.125 + 3 / 7 + 0.4
    assert f"{held:.2f} GE of a team-wide cap of 10.00 GE ({round(10 * held)}%)" in facts
    pools = page.split('id="quota-pools"')[1].split("</table>")[0]
    assert "<td>A100</td><td class=\"num\">4.00</td>" in pools and "0.38" in pools  # 3 of 4 L4 shares at 0.5
    breakdown = page.split('id="quota-breakdown"')[1].split("</table>")[0]
    assert f"<td>time_slicing</td><td>{L4}</td>" in breakdown and f"<td>mig</td><td>{A100}</td>" in breakdown
    dashboard = browser(world.member).get("/").content.decode()
    teams = dashboard.split('id="teams-ge"')[1].split("</section>")[0]
    assert f"{held:.2f}" in teams and "10.00 (" in teams and f"vgpu · {A100}: 0.40" in teams
    # The pools table: ml's H100s weigh 2 each, 6 of 16 GE held (infra holds one too).
    assert "6.00 / 16.00" in dashboard


def test_an_early_release_shows_when_it_ended_beside_its_booked_end(world, browser, api):
    _, end = window(0, 3)
    client = api(world.member)
    early = client.post("/api/v1/reservations/", {"pool": "a100", "team": "ml", "gpus": 1,
                                                  "ends_at": end.isoformat()}, format="json").json()["id"]
    assert client.post(f"/api/v1/reservations/{early}/release/").status_code == 200
    released = Reservation.objects.get(pk=early)
    assert released.ended_at is not None and released.ended_early
    booked, ended = (timezones.when(t) for t in (released.ends_at, released.ended_at))
    # A reservation that ran its whole window shows no second end.
    full = client.post("/api/v1/reservations/", {"pool": "a100", "team": "ml", "gpus": 1,
                                                 "ends_at": end.isoformat()}, format="json").json()["id"]
    Reservation.objects.filter(pk=full).update(state=Reservation.State.EXPIRED, ended_at=end + timedelta(seconds=30))

    listing = browser(world.member).get("/reservations/").content.decode()
    row = listing[listing.index(f'id="reservation-{early}"'):]
    row = row[:row.index("</tr>")]
    assert booked in row and f"ended {ended}" in row
    full_row = listing[listing.index(f'id="reservation-{full}"'):]
    assert "ended-early" not in full_row[:full_row.index("</tr>")]

    detail = browser(world.member).get(f"/reservations/{early}/").content.decode()
    assert "Booked window" in detail and timezones.window(released.starts_at, released.ends_at) in detail
    assert f'<dd id="ended-at">{ended}' in detail
    assert 'id="ended-at"' not in browser(world.member).get(f"/reservations/{full}/").content.decode()


def test_release_without_confirm_asks_and_changes_nothing(world, browser, api):
    _, end = window(0, 2)
    rid = api(world.member).post("/api/v1/reservations/", {"pool": "a100", "team": "ml", "gpus": 2,
                                                           "ends_at": end.isoformat()}, format="json").json()["id"]
    state = Reservation.objects.get(pk=rid).state
    client = browser(world.member)
    answer = client.post(f"/reservations/{rid}/release/", {"next": f"/reservations/{rid}/"})
    assert answer.status_code == 200
    page = answer.content.decode()
    assert f"Release reservation #{rid} of team ML, 2 GPUs of A100, now?" in page
    assert 'name="confirm" value="yes"' in page and f'name="next" value="/reservations/{rid}/"' in page
    assert Reservation.objects.get(pk=rid).state == state and Reservation.objects.get(pk=rid).ended_at is None
    # The page's own button posts again with confirm=yes: that releases.
    answer = client.post(f"/reservations/{rid}/release/", {"confirm": "yes", "next": f"/reservations/{rid}/"})
    assert answer.status_code == 302 and answer["Location"] == f"/reservations/{rid}/"
    assert Reservation.objects.get(pk=rid).state in ("releasing", "released")


def test_a_future_reservation_is_cancelled_after_asking(world, browser, api):
    start, end = window(5, 7)
    rid = api(world.member).post("/api/v1/reservations/", {"pool": "a100", "team": "ml", "gpus": 1,
                                                           "starts_at": start.isoformat(), "ends_at": end.isoformat()},
                                 format="json").json()["id"]
    client = browser(world.member)
    page = client.post(f"/reservations/{rid}/release/").content.decode()
    assert f"Cancel reservation #{rid} of team ML, 1 GPU of A100, now?" in page
    assert Reservation.objects.get(pk=rid).state == Reservation.State.SCHEDULED
    client.post(f"/reservations/{rid}/release/", {"confirm": "yes"})
    assert Reservation.objects.get(pk=rid).state in ("releasing", "released")  # a cancel is a release


def test_a_release_goes_back_only_to_the_portals_own_pages(world, browser, api):
    # `next` came from the form as posted: a link to another site made the portal an open redirect.
    _, end = window(0, 2)
    rid = api(world.member).post("/api/v1/reservations/", {"pool": "a100", "team": "ml", "gpus": 1,
                                                           "ends_at": end.isoformat()}, format="json").json()["id"]
    client = browser(world.member)
    asked = client.post(f"/reservations/{rid}/release/", {"next": "https://evil.example/phish"}).content.decode()
    assert "evil.example" not in asked
    answer = client.post(f"/reservations/{rid}/release/", {"confirm": "yes", "next": "//evil.example/x"})
    assert answer.status_code == 302 and answer["Location"] == "/reservations/"


def test_timeline_day_labels_never_sit_in_adjacent_slots():
    # In the 7-day view (6-hour slots) a timeline starting at 18:00 reached the next date one slot later:
    # "Tue 24" and "Wed 25" ran into each other. The first slot then shows only its hour.
    from datetime import datetime, timezone

    from allocations.selectors import Slot
    from portal.views import _timeline_labels

    def labels(first_hour: int, hours: int) -> list[tuple[str, str]]:
        start = datetime(2026, 11, 24, first_hour, tzinfo=timezone.utc)
        slots = [Slot(start=start + timedelta(hours=hours * i), end=start + timedelta(hours=hours * (i + 1)),
                      free=1, free_on_one_node=1) for i in range(28)]
        return [(day, hour) for _, day, hour, _ in _timeline_labels(slots)]

    late = labels(18, 6)
    assert late[0] == ("", "18h") and late[1][0] == "Wed 25"
    days = [i for i, (day, _) in enumerate(late) if day]
    assert all(b - a >= 2 for a, b in zip(days, days[1:]))
    early = labels(0, 6)
    assert early[0][0] == "Tue 24" and early[4][0] == "Wed 25"
