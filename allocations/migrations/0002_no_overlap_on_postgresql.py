"""On PostgreSQL, make two overlapping allocation windows on one GPU impossible.

The placement code already checks under a row lock; this is the database's own
guarantee behind it. SQLite (embedded mode) has no exclusion constraints and
serializes writers instead (transaction_mode IMMEDIATE).
"""
from django.db import migrations

CONSTRAINT = "allocation_no_overlap_on_gpu"


def add_constraint(apps, schema_editor):
    if schema_editor.connection.vendor != "postgresql":
        return
    schema_editor.execute("CREATE EXTENSION IF NOT EXISTS btree_gist")
    schema_editor.execute(
        f"ALTER TABLE allocations_allocation ADD CONSTRAINT {CONSTRAINT} "
        "EXCLUDE USING gist (gpu_id WITH =, tstzrange(starts_at, ends_at, '[)') WITH &&)"
    )


def drop_constraint(apps, schema_editor):
    if schema_editor.connection.vendor != "postgresql":
        return
    schema_editor.execute(f"ALTER TABLE allocations_allocation DROP CONSTRAINT IF EXISTS {CONSTRAINT}")


class Migration(migrations.Migration):
    dependencies = [("allocations", "0001_initial")]
    operations = [migrations.RunPython(add_constraint, drop_constraint)]
