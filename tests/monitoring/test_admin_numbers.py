"""The admin writes an alert's value for people (95.0), not the float's every digit."""
from __future__ import annotations

from django.test import Client
from django.utils import timezone

from monitoring.models import Alert, AlertRule


def test_an_alert_value_reads_rounded_in_the_admin(world):
    rule = AlertRule.objects.create(name="Overload", metric="gpu_util", scope="gpu", comparison=">=", threshold=95,
                                    for_seconds=0)
    alert = Alert.objects.create(rule=rule, subject="gpu:1", subject_label="lab/node-a GPU 0", value=95.00086828167058,
                                 active_since=timezone.now())
    client = Client()
    client.force_login(world.staff)
    for url in ("/admin/monitoring/alert/", f"/admin/monitoring/alert/{alert.pk}/change/"):
        page = client.get(url).content.decode()
        assert "95.0" in page and "95.00086" not in page, url
