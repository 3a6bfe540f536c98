"""Raw samples in an UNLOGGED table (PostgreSQL).

10,000 GPUs write 10,000 rows a second here, and each row's write-ahead log record was a
large part of PostgreSQL's CPU for them. Raw rows live an hour and are rolled up into the
minute and hour tables (logged as before). The price: after a PostgreSQL crash this table
comes back empty (at most an hour of full-resolution points; the rollups stay), and it is
not copied to streaming replicas.
"""
from django.db import migrations


def _alter(persistence: str):
    def run(apps, schema_editor):
        if schema_editor.connection.vendor == "postgresql":
            schema_editor.execute(f"ALTER TABLE monitoring_sample SET {persistence}")
    return run


class Migration(migrations.Migration):
    dependencies = [("monitoring", "0002_brin_and_default_rules")]

    operations = [migrations.RunPython(_alter("UNLOGGED"), _alter("LOGGED"))]
