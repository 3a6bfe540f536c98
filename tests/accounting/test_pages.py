"""The statement page (HTML and CSV) and the Reports page: who sees what, and the CSVs carry the figures."""
from __future__ import annotations

import csv
import io
import json
from datetime import UTC

import pytest
from django.utils import timezone

from accounting import reports
from accounting.ledger import ledger_hour_close
from accounting.selectors import team_statement
from allocations.models import Quota
from tests.accounting.history import grant
from tests.accounting.test_chargeback import APRIL, priced  # noqa: F401 (the fixture)

pytestmark = pytest.mark.django_db


def _csv(response) -> list[list[str]]:
    return list(csv.reader(io.StringIO(response.content.decode())))


def test_the_statement_page_and_its_csv(priced, client):  # noqa: F811
    url = "/teams/ml/statements/2025-03/"
    client.force_login(priced.outsider)
    assert client.get(url).status_code == 404  # not their team
    client.force_login(priced.member)
    page = client.get(url)
    assert page.status_code == 200
    html = page.content.decode()
    assert "provisional" in html and "12.00 CNY" in html and "data-print" in html and "css/print.css" in html
    rows = _csv(client.get(url, {"format": "csv"}))
    assert rows[0] == ["pool", "gpu_model", "mode", "booked_ge_hours", "used_ge_hours", "idle_ge_hours",
                       "gpu_hours", "cost", "currency"]
    line = team_statement(priced.team, APRIL.date().replace(month=3)).lines[0]
    assert rows[1] == [str(line[name]) for name in rows[0]]
    assert rows[-1][0] == "total" and rows[-1][-2:] == ["12.0", "CNY"]
    assert client.get("/teams/ml/statements/2025-3/").status_code == 404
    month = f"{timezone.now().astimezone(UTC):%Y-%m}"
    assert f'href="/teams/ml/statements/{month}/"' in client.get("/teams/ml/").content.decode()  # from the team page


def test_reports_show_the_viewers_teams_and_each_csv_is_its_chart(priced, client):  # noqa: F811
    Quota.objects.filter(team=priced.team, pool=priced.pool).update(ge_hours_per_month=100)
    now = timezone.now().astimezone(UTC).replace(minute=0, second=0, microsecond=0)
    a100 = list(priced.pool.gpus.order_by("pk"))
    grant(priced.team, priced.pool, a100[3], now.replace(hour=0, day=1), now.replace(hour=0, day=1).replace(hour=2),
          ge=1.0, user=priced.member)
    ledger_hour_close(hour=now.replace(hour=0, day=1), final=False)
    params = {"start": "2025-03", "end": "2025-04"}
    client.force_login(priced.member)
    page = client.get("/reports/", params)
    assert page.status_code == 200
    tables = json.loads(page.content.decode().split('id="report-data" type="application/json">')[1].split("</script>")[0])
    assert {row[1] for row in tables["ge_hours_by_team"]["rows"]} == {"ml"}  # not infra: not their team
    assert tables["ge_hours_by_team"]["rows"] == [["2025-03", "ml", 6.0], ["2025-04", "ml", 1.0]]
    assert tables["quota"]["rows"] == [["ml", "a100", f"{now:%Y-%m}", 1.0, 100.0]]
    for chart in reports.CHARTS:
        rows = _csv(client.get(f"/reports/{chart}.csv", params))
        assert rows[0] == tables[chart]["header"]
        assert rows[1:] == [["" if v is None else str(v) for v in row] for row in tables[chart]["rows"]]
    client.force_login(priced.staff)
    staff = client.get("/reports/efficiency.csv", {**params, "pool": "l4"})
    assert _csv(staff)[1:] == [["infra", "1.0", "0.0", "0.0"]]
    client.logout()
    assert client.get("/reports/").status_code == 302  # to sign in
