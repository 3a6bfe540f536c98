"""The embedded demo's data and its one-process command."""
import os
import stat
import subprocess
import sys

import pytest
from django.contrib.auth import get_user_model
from django.core.exceptions import ValidationError
from django.core.management import CommandError, call_command

from allocations import services
from allocations.models import Quota
from config.demo import load_demo
from inventory.models import Gpu, GpuPool
from tests.conftest import BASE_DIR
from tests.factories import window


def _embedded_env(var_dir, **extra) -> dict[str, str]:
    env = {key: value for key, value in os.environ.items()
           if key not in ("DATABASE_URL", "REDIS_URL", "SECRET_KEY", "DEMO_ADMIN_PASSWORD")}
    return dict(env, PORTAL_VAR_DIR=str(var_dir), DJANGO_SETTINGS_MODULE="config.settings", **extra)


def _mode(path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_the_demo_has_whole_mig_and_shared_pools_two_teams_and_accounts(db):
    created = load_demo(admin_password="plenty-of-entropy-7q")
    assert created["admin"] == "plenty-of-entropy-7q" and set(created) == {"admin", "alice", "bob", "carol"}
    assert {p.slug: (p.sharing_mode, p.gpus.count()) for p in GpuPool.objects.all()} == {
        "h100": ("exclusive", 16), "l40s": ("exclusive", 4), "a100-mig": ("mig", 4), "l4-shared": ("time_slicing", 4)}
    assert Gpu.objects.values("uuid").distinct().count() == 28
    assert Quota.objects.count() == 8


def test_a_demo_member_can_book_a_mig_slice_and_a_share(db):
    load_demo()
    from django.contrib.auth import get_user_model

    bob = get_user_model().objects.get(username="bob")
    _, end = window(0, 1)
    mig = services.reservation_create(actor=bob, request=services.ReservationRequest(
        team="vision", pool="a100-mig", mig_profile="3g.40gb", ends_at=end))
    assert mig.ge == pytest.approx(3 / 7 * 0.6)
    share = services.reservation_create(actor=bob, request=services.ReservationRequest(
        team="vision", pool="l4-shared", shares=2, ends_at=end))
    assert share.ge == pytest.approx(2 / 4 * 0.2)


def test_a_demo_member_can_reserve_at_once(db):
    load_demo()
    from django.contrib.auth import get_user_model

    bob = get_user_model().objects.get(username="bob")
    _, end = window(0, 1)
    reservation = services.reservation_create(actor=bob, request=services.ReservationRequest(
        team="vision", pool="h100", gpus=8, ends_at=end))
    assert reservation.allocations.values("gpu__node").distinct().count() == 1


def test_the_embedded_command_refuses_to_run_with_redis_configured(db, settings):
    settings.EMBEDDED = False
    with pytest.raises(CommandError, match="unset REDIS_URL"):
        call_command("runembedded")


def test_a_weak_demo_admin_password_is_refused_and_nothing_is_loaded(db):
    with pytest.raises(ValidationError) as refused:
        load_demo(admin_password="admin")
    assert len(refused.value.messages) >= 3  # too similar to the username, too short, too common
    assert not get_user_model().objects.exists() and not GpuPool.objects.exists()


def test_a_weak_demo_admin_password_stops_the_embedded_server_with_the_reasons(tmp_path):
    done = subprocess.run([sys.executable, "manage.py", "runembedded", "--port", "1", "--no-agents"], cwd=BASE_DIR,
                          env=_embedded_env(tmp_path / "var", DEMO_ADMIN_PASSWORD="admin"),
                          capture_output=True, text=True, timeout=120)
    assert done.returncode != 0
    assert "DEMO_ADMIN_PASSWORD is refused" in done.stderr
    for reason in ("too similar to the username", "too short", "too common"):
        assert reason in done.stderr, done.stderr
    assert not (tmp_path / "var" / "demo-credentials.txt").exists()


def test_the_embedded_folder_database_and_secret_key_are_private(tmp_path):
    var = tmp_path / "var"
    script = ("import django; django.setup(); from django.db import connection; "
              "connection.cursor().execute('CREATE TABLE probe (x integer)')")
    subprocess.run([sys.executable, "-c", script], cwd=BASE_DIR, env=_embedded_env(var), check=True, timeout=120)
    assert _mode(var) == 0o700
    assert _mode(var / "secret_key") == 0o600
    assert _mode(var / "portal.sqlite3") == 0o600
    # A folder an earlier version left world-readable is narrowed at the next start.
    var.chmod(0o755)
    (var / "portal.sqlite3").chmod(0o644)
    (var / "secret_key").chmod(0o644)
    subprocess.run([sys.executable, "-c", script.replace("CREATE TABLE probe", "CREATE TABLE probe2")],
                   cwd=BASE_DIR, env=_embedded_env(var), check=True, timeout=120)
    assert (_mode(var), _mode(var / "portal.sqlite3"), _mode(var / "secret_key")) == (0o700, 0o600, 0o600)
