"""The audit log with Simplified Chinese about (issue 23): its admin labels are translated, and what an
entry records is written in the portal's default language whoever acted, in whatever language."""
from __future__ import annotations

import pytest
from django.contrib.contenttypes.models import ContentType
from django.test import Client
from django.utils import translation

from audit.models import AuditEntry
from inventory.models import GpuModel
from inventory.services import gpu_model_weight_set
from teams.models import Membership

pytestmark = pytest.mark.django_db


def _last(model) -> AuditEntry:
    return AuditEntry.objects.filter(content_type=ContentType.objects.get_for_model(model)).latest("timestamp", "id")


def test_an_entry_written_while_speaking_chinese_is_in_the_portals_language(world, settings):
    settings.LANGUAGE_CODE = "en"
    model = world.pool.gpus.first().model_name
    with translation.override("zh-hans"):
        gpu_model_weight_set(actor=world.staff, name=model, weight="0.5")
        assert str(GpuModel.objects.get(name=model)) == f"{model}（权重 0.500）"
        membership = Membership.objects.get(user=world.member)
        membership.role = Membership.Role.MANAGER
        membership.save()
    assert _last(GpuModel).object_repr == f"{model} (weight 0.500)"
    assert _last(Membership).object_repr == "member in ML (Manager)"


def test_the_audit_admin_in_chinese(world):
    gpu_model_weight_set(actor=world.staff, name=world.pool.gpus.first().model_name, weight="0.5")
    client = Client()
    client.force_login(world.staff)
    page = client.get("/admin/audit/auditentry/", HTTP_ACCEPT_LANGUAGE="zh-hans").content.decode()
    assert "审计日志" in page and "审计条目" in page and "操作人" in page and "来源" in page
    english = client.get("/admin/audit/auditentry/", HTTP_ACCEPT_LANGUAGE="en").content.decode()
    assert "Audit log" in english and "audit entries" in english.lower() and "审计" not in english
