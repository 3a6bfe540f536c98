"""Inputs that once reached the database raw (found by schemathesis) are bounded."""

import pytest


def test_huge_limit_and_offset_page_instead_of_failing(world, api):
    client = api(world.member)
    response = client.get("/api/v1/teams/", {"limit": "39039616579223154757602377728", "offset": "-3576242998317"})
    assert response.status_code == 200
    response = client.get("/api/v1/reservations/", {"limit": "5", "offset": str(10**30)})
    assert response.status_code == 200 and response.json()["results"] == []



@pytest.mark.parametrize("url", ["/api/v1/nodes/", "/api/v1/alert-rules/", "/api/v1/reservations/"])
def test_a_json_body_nested_too_deeply_is_a_400(world, api, url):
    # json.loads raises RecursionError here (not the ValueError DRF's parser catches): it was a 500.
    response = api(world.staff).generic("POST", url, "[" * 100_000, content_type="application/json")
    assert response.status_code == 400
    assert response.json()["errors"][0]["field"] == "body" and response.json()["errors"][0]["rule"] == "malformed"
