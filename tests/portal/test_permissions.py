"""Who may see and do what: owner (team manager), member, outsider (another team), staff, anonymous."""
from __future__ import annotations

import pytest

from tests.allocations.test_reservation_lifecycle import reserve
from tests.factories import ClusterFactory, MembershipFactory, UserFactory, window


@pytest.fixture
def reservation_id(world, api):
    _, end = window(0, 2)
    response = api(world.member).post("/api/v1/reservations/", {"pool": "a100", "team": "ml", "gpus": 1,
                                                                "ends_at": end.isoformat()}, format="json")
    return response.json()["id"]


@pytest.mark.parametrize(("persona", "status"), [("owner", 200), ("member", 200), ("staff", 200),
                                                 ("outsider", 404)])
def test_a_reservation_is_visible_to_its_team_only(world, api, reservation_id, persona, status):
    assert api(getattr(world, persona)).get(f"/api/v1/reservations/{reservation_id}/").status_code == status


@pytest.mark.parametrize("action", ["release", "extend"])
def test_outsiders_cannot_act_on_a_reservation_and_learn_nothing(world, api, reservation_id, action):
    response = api(world.outsider).post(f"/api/v1/reservations/{reservation_id}/{action}/",
                                        {"ends_at": window(0, 9)[1].isoformat()}, format="json")
    assert response.status_code == 404


def test_any_member_of_the_team_may_release_its_reservation(world, api, reservation_id):
    assert api(world.owner).post(f"/api/v1/reservations/{reservation_id}/release/").status_code == 200


def test_lists_show_only_the_callers_teams(world, api, reservation_id):
    assert [r["id"] for r in api(world.member).get("/api/v1/reservations/").json()["results"]] == [reservation_id]
    assert api(world.outsider).get("/api/v1/reservations/").json()["results"] == []
    assert api(world.staff).get("/api/v1/reservations/").json()["count"] == 1


def test_reservations_filter_by_state_and_pool(world, api, reservation_id):
    client = api(world.member)
    assert client.get("/api/v1/reservations/?state=scheduled&pool=a100").json()["count"] == 1
    assert client.get("/api/v1/reservations/?state=released").json()["count"] == 0
    bad = client.get("/api/v1/reservations/?state=sleeping")
    assert bad.status_code == 400 and bad.json()["errors"][0]["field"] == "state"


def test_pools_are_visible_where_the_team_has_a_quota(world, api):
    assert [p["slug"] for p in api(world.member).get("/api/v1/pools/").json()["results"]] == ["a100"]
    assert [p["slug"] for p in api(world.outsider).get("/api/v1/pools/").json()["results"]] == ["a100", "l4"]
    assert api(world.member).get("/api/v1/pools/l4/").status_code == 404


def test_pool_occupancy_counts_gpus_held_now(world, api, reservation_id):
    pool = api(world.member).get("/api/v1/pools/a100/").json()
    assert (pool["gpus_total"], pool["gpus_healthy"], pool["gpus_allocated"], pool["gpus_free"]) == (8, 8, 1, 7)


def test_only_staff_create_pools_quotas_and_clusters(world, api):
    pool = {"slug": "h200", "name": "H200", "sharing_mode": "exclusive"}
    quota = {"team": "ml", "pool": "l4", "max_ge": 1}
    cluster = {"name": "k8s-east", "slug": "k8s-east", "kind": "kubernetes"}
    for persona in ("owner", "member"):
        client = api(getattr(world, persona))
        assert client.post("/api/v1/pools/", pool, format="json").status_code == 403
        assert client.post("/api/v1/quotas/", quota, format="json").status_code == 403
        assert client.post("/api/v1/clusters/", cluster, format="json").status_code == 403
    staff = api(world.staff)
    assert staff.post("/api/v1/pools/", pool, format="json").status_code == 201
    assert staff.post("/api/v1/quotas/", quota, format="json").status_code == 201
    assert staff.post("/api/v1/clusters/", cluster, format="json").status_code == 201


def test_a_pool_with_a_bad_sharing_config_is_refused_naming_the_rule(world, api):
    response = api(world.staff).post("/api/v1/pools/", {"slug": "ts", "name": "TS", "sharing_mode": "time_slicing",
                                                        "sharing_config": {"replicas": 1}}, format="json")
    assert response.status_code == 400
    assert response.json()["errors"][0]["field"] == "sharing_config"
    assert "replicas must be an integer from 2 to 64" in response.json()["errors"][0]["message"]


def test_every_sharing_mode_can_be_stored(world, api):
    staff = api(world.staff)
    for mode, config in [("exclusive", {}), ("time_slicing", {"replicas": 4}), ("mps", {"replicas": 2}),
                         ("mig", {"profiles": {"1g.10gb": 7}}), ("vgpu", {"default_memory_mib": 8192})]:
        response = staff.post("/api/v1/pools/", {"slug": mode.replace("_", "-"), "name": mode,
                                                 "sharing_mode": mode, "sharing_config": config}, format="json")
        assert response.status_code == 201, response.content


def test_members_read_their_quotas_but_cannot_change_them(world, api):
    client = api(world.member)
    quotas = client.get("/api/v1/quotas/").json()["results"]
    assert [(q["team"], q["pool"], q["max_ge"]) for q in quotas] == [("ml", "a100", 6)]
    assert client.patch(f"/api/v1/quotas/{quotas[0]['id']}/", {"max_ge": 99}, format="json").status_code == 403


def test_a_quota_cannot_move_to_another_team(world, api):
    quota = world.team.quotas.get()
    response = api(world.staff).patch(f"/api/v1/quotas/{quota.pk}/", {"team": "infra"}, format="json")
    assert response.status_code == 400
    assert response.json()["errors"][0] == {"field": "team", "rule": "immutable",
                                            "message": "A quota's team cannot change; create another quota."}


def test_inventory_is_staff_only(world, api):
    ClusterFactory(slug="lab")
    for path in ("/api/v1/clusters/", "/api/v1/nodes/", "/api/v1/gpus/"):
        assert api(world.member).get(path).status_code == 403
        assert api(world.staff).get(path).status_code == 200
    assert api(world.staff).get("/api/v1/gpus/?pool=a100").json()["count"] == 8


def test_managers_manage_members_and_members_do_not(world, api):
    UserFactory(username="newcomer")
    assert api(world.member).post("/api/v1/teams/ml/members/", {"username": "newcomer"},
                                  format="json").status_code == 403
    owner = api(world.owner)
    assert owner.post("/api/v1/teams/ml/members/", {"username": "newcomer"}, format="json").status_code == 201
    assert owner.patch("/api/v1/teams/ml/members/newcomer/", {"role": "manager"}, format="json").status_code == 200
    assert owner.delete("/api/v1/teams/ml/members/newcomer/").status_code == 204
    members = api(world.member).get("/api/v1/teams/ml/members/").json()
    assert members["count"] == 2 and [m["username"] for m in members["results"]] == ["member", "owner"]


def test_team_members_are_paged_like_every_list(world, api):
    for i in range(3):
        MembershipFactory(user=UserFactory(username=f"user-{i}"), team=world.team)
    page = api(world.member).get("/api/v1/teams/ml/members/?limit=2&offset=2").json()
    assert page["count"] == 5 and [m["username"] for m in page["results"]] == ["user-0", "user-1"]
    assert page["next"].endswith("/api/v1/teams/ml/members/?limit=2&offset=4")


def test_managers_cannot_touch_other_teams(world, api):
    assert api(world.owner).get("/api/v1/teams/infra/members/").status_code == 404
    assert api(world.owner).delete("/api/v1/teams/infra/members/outsider/").status_code == 404


def test_a_team_keeps_one_manager(world, api):
    response = api(world.owner).delete("/api/v1/teams/ml/members/owner/")
    assert response.status_code == 409
    assert response.json()["errors"][0]["rule"] == "last_manager"


def test_adding_an_unknown_user_names_the_field(world, api):
    response = api(world.owner).post("/api/v1/teams/ml/members/", {"username": "ghost", "role": "boss"},
                                     format="json")
    assert response.status_code == 400
    assert ("role", "invalid_choice") in [(e["field"], e["rule"]) for e in response.json()["errors"]]


def test_only_staff_create_teams(world, api):
    assert api(world.owner).post("/api/v1/teams/", {"slug": "new", "name": "New"}, format="json").status_code == 403
    assert api(world.staff).post("/api/v1/teams/", {"slug": "new", "name": "New"}, format="json").status_code == 201
    assert api(world.staff).post("/api/v1/teams/", {"slug": "new", "name": "New"}, format="json").status_code == 400


def test_anonymous_callers_get_401_everywhere_in_the_api(world, api):
    for path in ("/api/v1/reservations/", "/api/v1/pools/", "/api/v1/quotas/", "/api/v1/teams/"):
        assert api().get(path).status_code == 401


def test_deleting_a_pool_or_team_still_in_use_is_a_409_not_a_500(world, api, reservation_id):
    staff = api(world.staff)
    pool = staff.delete("/api/v1/pools/a100/")
    assert pool.status_code == 409
    assert pool.json()["errors"][0]["rule"] == "protected"
    assert "reservations" in pool.json()["detail"]
    assert staff.delete("/api/v1/teams/ml/").status_code == 409
    assert staff.delete(f"/api/v1/clusters/{world.pool.gpus.first().node.cluster_id}/").status_code == 409


def test_staff_rename_and_delete_teams_members_cannot(world, api):
    assert api(world.owner).patch("/api/v1/teams/ml/", {"name": "Mine"}, format="json").status_code == 403
    assert api(world.staff).patch("/api/v1/teams/ml/", {"name": "Machine Learning"}, format="json").json()[
        "name"] == "Machine Learning"
    assert api(world.staff).post("/api/v1/teams/", {"slug": "empty", "name": "Empty"}, format="json").status_code == 201
    assert api(world.staff).delete("/api/v1/teams/empty/").status_code == 204


def test_the_reservation_list_pages_newest_first_with_the_total(world, api):
    client = api(world.member)
    ids = [reserve(client, hours_from_now=h)["id"] for h in (1, 3, 2)]
    first = client.get("/api/v1/reservations/?limit=2").json()
    assert first["count"] == 3 and [r["id"] for r in first["results"]] == [ids[1], ids[2]]
    assert "offset=2" in first["next"]
    rest = client.get(first["next"]).json()
    assert rest["count"] == 3 and [r["id"] for r in rest["results"]] == [ids[0]] and rest["next"] is None
    assert client.get("/api/v1/reservations/?limit=2&pool=l4").json()["count"] == 0
    assert api(world.outsider).get("/api/v1/reservations/?limit=2").json() == {
        "count": 0, "next": None, "previous": None, "results": []}
