"""The share_memory metric, and its default rule: a holder using more GPU memory than its share.

Time-slicing isolates no memory, so one tenant of a shared card can starve the others; MPS and
vGPU caps and MIG instances are enforced, and their rule fires only when a host's limits failed.
The rule tells the holder's whole team (the member who runs the job included) and staff."""
from django.db import migrations, models

RULE = "GPU share memory exceeded"


def add_rule(apps, schema_editor):
    apps.get_model("monitoring", "AlertRule").objects.get_or_create(name=RULE, defaults={
        "metric": "share_memory", "scope": "gpu", "comparison": ">", "threshold": 100, "for_seconds": 120,
        "severity": "warning", "notify_team_managers": True, "notify_team_members": True, "notify_staff": True})


def remove_rule(apps, schema_editor):
    apps.get_model("monitoring", "AlertRule").objects.filter(name=RULE, metric="share_memory").delete()


class Migration(migrations.Migration):

    dependencies = [
        ("monitoring", "0005_teams_app"),
    ]

    operations = [
        migrations.AlterField(
            model_name="alert",
            name="subject",
            field=models.CharField(help_text="gpu:<id>, node:<id>, pool:<id>, team:<id> or share:<reservation id>:gpu:<id>[:mig:<start>]", max_length=64),
        ),
        migrations.AlterField(
            model_name="alertrule",
            name="metric",
            field=models.CharField(choices=[("gpu_util", "GPU utilization (%)"), ("gpu_memory", "GPU memory used (%)"), ("gpu_temperature", "GPU temperature (°C)"), ("gpu_power", "GPU power (W)"), ("gpu_idle_allocated", "Utilization of an allocated GPU (%)"), ("host_silent", "Seconds since the host last reported"), ("pool_allocation", "Pool GPUs allocated (%)"), ("share_memory", "GPU memory a holder uses, % of its share")], max_length=32),
        ),
        migrations.RunPython(add_rule, remove_rule),
    ]
