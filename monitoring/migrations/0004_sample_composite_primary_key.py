"""Raw samples keyed by (gpu_id, ts), without the id column.

The (gpu_id, ts) unique constraint already was the dedup rule and the read path; the id
column only added a sequence call and a second B-tree to every insert. Measured on scratch
tables like this one (100-row batches through unnest, ON CONFLICT DO NOTHING): 1.56-1.60 ms
of PostgreSQL CPU per batch with the id, 1.02-1.19 ms without. Rows are kept: PostgreSQL
swaps the keys in place (the new primary key's index is built once: on a full table of
10,000 GPUs, an hour of rows, count a minute or two under an exclusive lock); SQLite
copies the table.
"""
from django.db import migrations, models

TABLE = "monitoring_sample"
COLUMNS = "gpu_id, pool_id, ts, util, mem_util, mem_used, mem_total, temp, power"


def _sqlite_remake(schema_editor, create_table) -> None:
    """SQLite cannot change a primary key in place: move the rows to a table made by create_table()."""
    run = schema_editor.execute
    run(f"ALTER TABLE {TABLE} RENAME TO {TABLE}__before")
    create_table()
    run(f"INSERT INTO {TABLE} ({COLUMNS}) SELECT {COLUMNS} FROM {TABLE}__before")
    run(f"DROP TABLE {TABLE}__before")
    run(f"CREATE INDEX IF NOT EXISTS sample_ts ON {TABLE} (ts)")


def to_composite(apps, schema_editor):
    if schema_editor.connection.vendor != "postgresql":
        # As the model now says (this runs after the state change below).
        _sqlite_remake(schema_editor, lambda: schema_editor.create_model(apps.get_model("monitoring", "Sample")))
        return
    for statement in (f"ALTER TABLE {TABLE} DROP CONSTRAINT {TABLE}_pkey", f"ALTER TABLE {TABLE} DROP COLUMN id",
                      f"ALTER TABLE {TABLE} ADD CONSTRAINT {TABLE}_pkey PRIMARY KEY (gpu_id, ts)",
                      f"ALTER TABLE {TABLE} DROP CONSTRAINT sample_one_per_gpu_second"):
        schema_editor.execute(statement)


def to_id(apps, schema_editor):
    if schema_editor.connection.vendor != "postgresql":
        _sqlite_remake(schema_editor, lambda: schema_editor.execute(
            f'CREATE TABLE {TABLE} ("id" integer NOT NULL PRIMARY KEY AUTOINCREMENT, "gpu_id" bigint NOT NULL, '
            '"pool_id" bigint NULL, "ts" bigint NOT NULL, "util" smallint NOT NULL, "mem_util" smallint NOT NULL, '
            '"mem_used" integer NOT NULL, "mem_total" integer NOT NULL, "temp" smallint NOT NULL, '
            '"power" real NOT NULL, CONSTRAINT "sample_one_per_gpu_second" UNIQUE ("gpu_id", "ts"))'))
        return
    for statement in (f"ALTER TABLE {TABLE} ADD CONSTRAINT sample_one_per_gpu_second UNIQUE (gpu_id, ts)",
                      f"ALTER TABLE {TABLE} DROP CONSTRAINT {TABLE}_pkey",
                      f"ALTER TABLE {TABLE} ADD COLUMN id bigserial PRIMARY KEY"):
        schema_editor.execute(statement)


class Migration(migrations.Migration):
    dependencies = [("monitoring", "0003_raw_samples_unlogged")]

    operations = [
        # The model's new shape first (state only), so that to_composite sees it; then the tables.
        migrations.SeparateDatabaseAndState(state_operations=[
            migrations.RemoveConstraint(model_name="sample", name="sample_one_per_gpu_second"),
            migrations.RemoveField(model_name="sample", name="id"),
            migrations.AddField(
                model_name="sample", name="pk",
                field=models.CompositePrimaryKey("gpu_id", "ts", blank=True, editable=False, primary_key=True,
                                                 serialize=False),
            ),
        ]),
        migrations.RunPython(to_composite, to_id),
    ]
