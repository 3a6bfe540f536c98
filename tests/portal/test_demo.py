"""The embedded demo's data and its one-process command."""
import pytest
from django.core.management import CommandError, call_command

from allocations import services
from allocations.models import Quota
from inventory.models import Gpu, GpuPool
from portal.demo import load_demo
from tests.factories import window


def test_the_demo_has_two_pools_two_teams_and_accounts(db):
    created = load_demo(admin_password="admin-pw")
    assert created["admin"] == "admin-pw" and set(created) == {"admin", "alice", "bob", "carol"}
    assert {p.slug: p.gpus.count() for p in GpuPool.objects.all()} == {"h100": 16, "l40s": 4}
    assert Gpu.objects.values("uuid").distinct().count() == 20
    assert Quota.objects.count() == 4


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
