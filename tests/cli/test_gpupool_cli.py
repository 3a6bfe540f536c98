"""`gpupool`, the installed console script, run as a subprocess against a running portal (the test's
live server on PostgreSQL; a real Celery worker process where a reservation must go active). The
fixture is in conftest.py; the languages are in test_gpupool_cli_languages.py."""
from __future__ import annotations

import json
import stat
import subprocess
import sys
from datetime import datetime, timedelta

import pytest

from allocations.models import Reservation
from teams.models import ApiToken
from tests.allocations.test_gpu_models import mixed  # noqa: F401 - the fixture
from tests.cli.conftest import CLI_DIR
from tests.factories import PASSWORD

pytestmark = [pytest.mark.django_db(transaction=True)]


def _login(gpupool, *extra: str) -> None:
    gpupool("login", "--username", "member", "--password-stdin", *extra, stdin=PASSWORD + "\n")


def test_login_keeps_a_0600_token_and_whoami_pools_list_work(world, gpupool):
    assert gpupool("whoami", check=3).stderr.startswith("Error: Not signed in")
    _login(gpupool, "--name", "laptop")
    mode = stat.S_IMODE(gpupool.config.stat().st_mode)
    assert mode == 0o600 and stat.S_IMODE(gpupool.config.parent.stat().st_mode) == 0o700
    saved = json.loads(gpupool.config.read_text())
    token = ApiToken.objects.get(user=world.member)
    assert saved["token"].startswith(token.prefix) and token.name == "laptop"
    me = json.loads(gpupool("whoami", "--json").stdout)
    assert me["username"] == "member" and [t["slug"] for t in me["teams"]] == ["ml"]
    pools = json.loads(gpupool("pools", "--json").stdout)
    assert [p["slug"] for p in pools] == ["a100"]  # the pools ml holds a quota in
    table = gpupool("pools").stdout
    assert "a100" in table and "exclusive" in table
    slots = json.loads(gpupool("availability", "a100", "--hours", "3", "--gpus", "2", "--json").stdout)
    assert len(slots) == 3 and all(s["fits"] for s in slots)


def test_a_wrong_password_exits_3_and_keeps_nothing(world, gpupool):
    done = gpupool("login", "--username", "member", "--password-stdin", stdin="nope\n", check=3)
    assert "invalid_credentials" in done.stderr and not gpupool.config.exists()


def test_reserve_show_extend_release_with_json_and_local_times(world, gpupool):
    _login(gpupool)
    booked = json.loads(gpupool("reserve", "a100", "--gpus", "2", "--until", "+2h", "--json").stdout)
    assert booked["team"] == "ml" and booked["gpus"] == 2  # ml is member's only team
    reservation = Reservation.objects.get(pk=booked["id"])
    shown = gpupool("show", str(booked["id"])).stdout
    assert f"#{booked['id']}" in shown and "CST" in shown  # times in the caller's zone (TZ=Asia/Shanghai)
    booked_end = reservation.ends_at
    extended = json.loads(gpupool("extend", str(booked["id"]), "--for", "1h", "--json").stdout)
    reservation.refresh_from_db()
    assert reservation.ends_at - booked_end == timedelta(hours=1)
    assert datetime.fromisoformat(extended["ends_at"].replace("Z", "+00:00")) == reservation.ends_at
    listed = json.loads(gpupool("list", "--json").stdout)
    assert [r["id"] for r in listed] == [booked["id"]]
    released = json.loads(gpupool("release", str(booked["id"]), "--json").stdout)
    assert released["state"] in ("released", "releasing")


@pytest.mark.parametrize(("args", "code", "rule"), [
    (("reserve", "a100", "--gpus", "7", "--until", "+2h", "--no-queue"), 6, None),  # beyond the quota: 409
    (("reserve", "a100", "--gpus", "99", "--until", "+2h"), 7, "exceeds_pool_size"),
    (("reserve", "nowhere", "--gpus", "1", "--until", "+2h"), 7, "does_not_exist"),
    (("reserve", "a100", "--team", "infra", "--gpus", "1", "--until", "+2h"), 4, None),
    (("show", "999999"), 5, "not_found"),
    (("reserve", "a100", "--gpus", "1"), 2, None),  # neither --for nor --until
])
def test_refusals_exit_with_codes_a_script_can_rely_on(world, gpupool, args, code, rule):
    _login(gpupool)
    done = gpupool(*args, check=code)
    if rule:
        assert rule in done.stderr
    assert not Reservation.objects.exists()


def test_a_read_only_login_cannot_book(world, gpupool):
    _login(gpupool, "--read-only")
    done = gpupool("reserve", "a100", "--gpus", "1", "--until", "+1h", check=4)
    assert "token_read_only" in done.stderr


def test_reserve_wait_exits_when_active_and_prints_the_environment(world, gpupool, celery_worker_process):
    _login(gpupool)
    done = gpupool("reserve", "a100", "--gpus", "2", "--for", "1h", "--wait", "--timeout", "60", "--interval", "0.5")
    reservation = Reservation.objects.get()
    assert reservation.state == "active"
    uuids = ",".join(g.uuid for g in sorted((a.gpu for a in reservation.allocations.all()),
                                            key=lambda gpu: (gpu.node_id, gpu.index)))
    assert f"export CUDA_VISIBLE_DEVICES={uuids}" in done.stdout.splitlines()
    assert f"export GPUPOOL_RESERVATION={reservation.pk}" in done.stdout
    assert "active" in done.stderr  # the progress went to stderr


def test_logout_revokes_the_token_at_the_portal(world, gpupool):
    _login(gpupool)
    assert ApiToken.objects.count() == 1
    gpupool("logout")
    assert not ApiToken.objects.exists() and not gpupool.config.exists()
    gpupool("whoami", check=3)


def test_the_cli_imports_nothing_of_the_portal():
    code = "import sys, gpupool_cli.main; bad = [m for m in sys.modules if m.split('.')[0] in " \
           "('django', 'rest_framework', 'allocations', 'teams', 'inventory', 'monitoring', 'config')]; " \
           "assert not bad, bad"
    subprocess.run([sys.executable, "-c", code], check=True, cwd=CLI_DIR)


def test_completion_scripts_are_printed(gpupool):
    assert "_GPUPOOL_COMPLETE" in gpupool("completion", "bash").stdout


def test_reserve_only_some_gpu_models(world, gpupool, mixed):
    from tests.allocations.test_gpu_models import H100

    _login(gpupool)
    booked = json.loads(gpupool("reserve", "mixed", "--gpus", "2", "--gpu-model", H100, "--until", "+2h",
                                "--json").stdout)
    assert booked["gpu_models"] == [H100] and {g["model_name"] for g in booked["grants"]} == {H100}
    assert f", only {H100}" in gpupool("show", str(booked["id"])).stdout
    refused = gpupool("reserve", "mixed", "--gpus", "1", "--gpu-model", "NVIDIA L4", "--until", "+2h", check=7)
    assert "not_in_pool" in refused.stderr


def test_availability_counts_only_the_models_asked(world, gpupool, mixed):
    from tests.allocations.test_gpu_models import A100, H100

    _login(gpupool)
    gpupool("reserve", "mixed", "--gpus", "2", "--gpu-model", H100, "--until", "+4h")  # one 2-H100 node taken
    free = {models: json.loads(gpupool("availability", "mixed", "--hours", "2", *args, "--json").stdout)[0]["free"]
            for models, args in (("any", ()), ("h100", ("--gpu-model", H100)),
                                 ("both", ("--gpu-model", H100, "--gpu-model", A100)))}
    assert free == {"any": 6, "h100": 2, "both": 6}
    refused = gpupool("availability", "mixed", "--gpu-model", "NVIDIA L4", check=7)
    assert "not_in_pool" in refused.stderr
