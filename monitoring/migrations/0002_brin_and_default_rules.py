"""A BRIN index for pruning raw samples by time (PostgreSQL), and the default alert rules."""
from django.db import migrations

DEFAULT_RULES = [
    # name, metric, scope, comparison, threshold, for_seconds, severity, managers, members, staff
    ("GPU overloaded", "gpu_util", "gpu", ">=", 95, 300, "warning", True, False, False),
    ("GPU memory nearly full", "gpu_memory", "gpu", ">=", 95, 300, "warning", True, False, False),
    ("GPU too hot", "gpu_temperature", "gpu", ">=", 85, 120, "critical", True, False, True),
    ("Host stopped reporting", "host_silent", "node", ">=", 120, 0, "critical", False, False, True),
    ("Pool capacity pressure", "pool_allocation", "pool", ">=", 90, 300, "warning", False, False, True),
    ("GPU allocated but idle", "gpu_idle_allocated", "gpu", "<=", 1, 1800, "info", True, True, False),
]


def brin(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute("CREATE INDEX IF NOT EXISTS sample_ts_brin ON monitoring_sample USING brin (ts)")
    else:
        schema_editor.execute("CREATE INDEX IF NOT EXISTS sample_ts ON monitoring_sample (ts)")


def unbrin(apps, schema_editor):
    name = "sample_ts_brin" if schema_editor.connection.vendor == "postgresql" else "sample_ts"
    schema_editor.execute(f"DROP INDEX IF EXISTS {name}")


def add_rules(apps, schema_editor):
    AlertRule = apps.get_model("monitoring", "AlertRule")
    for name, metric, scope, comparison, threshold, for_s, severity, managers, members, staff in DEFAULT_RULES:
        AlertRule.objects.get_or_create(name=name, defaults={
            "metric": metric, "scope": scope, "comparison": comparison, "threshold": threshold, "for_seconds": for_s,
            "severity": severity, "notify_team_managers": managers, "notify_team_members": members,
            "notify_staff": staff})


def remove_rules(apps, schema_editor):
    apps.get_model("monitoring", "AlertRule").objects.filter(name__in=[r[0] for r in DEFAULT_RULES]).delete()


class Migration(migrations.Migration):
    dependencies = [("monitoring", "0001_initial")]

    operations = [
        migrations.RunPython(brin, unbrin),
        migrations.RunPython(add_rules, remove_rules),
    ]
