"""Sharing: quotas in GPU-equivalents, the shape of a shared reservation, and the vGPU guard.

- Quota.max_gpus becomes max_ge and gpu_hours_per_month ge_hours_per_month, decimals. Every
  existing quota counted whole GPUs of weight 1.0 (no weights existed), so N GPUs is N GE and
  its meaning is unchanged; going back rounds to whole numbers.
- A reservation records its sharing mode and what was asked in the pool's unit, and the GE
  its grants were charged (existing ones: whole GPUs of weight 1.0, so `gpus`).
- A grant records its mode and the GE it was charged (existing: whole GPUs, 1.0).
- On PostgreSQL, vgpu grants (memory MiB + cores % of a GPU, no part of the share space) leave
  the share exclusion constraint. A second exclusion constraint keeps a vgpu grant and a grant
  of any other mode from holding one GPU at overlapping times, and a trigger on vgpu rows only,
  under a lock on the GPU's row, refuses a write that makes the GPU's overlapping vgpu grants
  hold more memory than the card has or more than 100 % of its cores at some instant. Grants of
  the other modes pay nothing more than before. SQLite serializes writers instead.
"""
from django.core.validators import MinValueValidator
from django.db import migrations, models

EXCLUSION = "allocation_no_overlapping_share"
MODES_APART = "allocation_vgpu_apart"

GUARD_FUNCTION = """
CREATE OR REPLACE FUNCTION allocation_vgpu_guard() RETURNS trigger AS $$
DECLARE
    card_memory integer;
    peak_memory bigint;
    peak_cores bigint;
BEGIN
    IF NEW.ends_at <= NEW.starts_at THEN
        RETURN NULL;  -- an empty (cancelled) window holds nothing
    END IF;
    -- One writer per GPU at a time: the sums below then see every committed grant.
    SELECT memory_mib INTO card_memory FROM inventory_gpu WHERE id = NEW.gpu_id FOR UPDATE;
    -- The peak of a sum of windows is reached where one of them starts: add up, at each start
    -- inside the new window, the vgpu grants that hold the GPU then.
    SELECT max(held.memory), max(held.cores) INTO peak_memory, peak_cores FROM (
        SELECT sum(coalesce(b.memory_mib, 0)) AS memory, sum(coalesce(b.cores_pct, 0)) AS cores
          FROM (SELECT DISTINCT greatest(a.starts_at, NEW.starts_at) AS at FROM allocations_allocation a
                 WHERE a.gpu_id = NEW.gpu_id AND a.mode = 'vgpu' AND a.starts_at < NEW.ends_at
                   AND a.ends_at > NEW.starts_at AND a.ends_at > a.starts_at) instants
          JOIN allocations_allocation b ON b.gpu_id = NEW.gpu_id AND b.mode = 'vgpu'
           AND b.starts_at <= instants.at AND b.ends_at > instants.at
         GROUP BY instants.at) held;
    IF peak_memory > card_memory OR peak_cores > 100 THEN
        RAISE EXCEPTION 'GPU % would hold % MiB of its % MiB and % %% of its cores', NEW.gpu_id, peak_memory,
            card_memory, peak_cores
            USING ERRCODE = 'exclusion_violation', CONSTRAINT = 'allocation_vgpu_guard';
    END IF;
    RETURN NULL;
END;
$$ LANGUAGE plpgsql;
"""


def guard_vgpu(apps, schema_editor):
    if schema_editor.connection.vendor != "postgresql":
        return
    schema_editor.execute(f"ALTER TABLE allocations_allocation DROP CONSTRAINT IF EXISTS {EXCLUSION}")
    schema_editor.execute(
        f"ALTER TABLE allocations_allocation ADD CONSTRAINT {EXCLUSION} EXCLUDE USING gist "
        "(gpu_id WITH =, int4range(share_from, share_to, '[)') WITH &&, "
        "tstzrange(starts_at, ends_at, '[)') WITH &&) WHERE (mode <> 'vgpu')"
    )
    schema_editor.execute(
        f"ALTER TABLE allocations_allocation ADD CONSTRAINT {MODES_APART} EXCLUDE USING gist "
        "(gpu_id WITH =, (mode = 'vgpu') WITH <>, tstzrange(starts_at, ends_at, '[)') WITH &&)"
    )
    schema_editor.execute(GUARD_FUNCTION, params=None)  # the body has % signs of its own
    schema_editor.execute(
        "CREATE TRIGGER allocation_vgpu_guard AFTER INSERT OR UPDATE OF gpu_id, starts_at, ends_at, mode, "
        "memory_mib, cores_pct ON allocations_allocation FOR EACH ROW WHEN (NEW.mode = 'vgpu') "
        "EXECUTE FUNCTION allocation_vgpu_guard()"
    )


def unguard_vgpu(apps, schema_editor):
    if schema_editor.connection.vendor != "postgresql":
        return
    schema_editor.execute("DROP TRIGGER IF EXISTS allocation_vgpu_guard ON allocations_allocation")
    schema_editor.execute("DROP FUNCTION IF EXISTS allocation_vgpu_guard()")
    schema_editor.execute(f"ALTER TABLE allocations_allocation DROP CONSTRAINT IF EXISTS {MODES_APART}")
    schema_editor.execute(f"ALTER TABLE allocations_allocation DROP CONSTRAINT IF EXISTS {EXCLUSION}")
    schema_editor.execute(
        f"ALTER TABLE allocations_allocation ADD CONSTRAINT {EXCLUSION} EXCLUDE USING gist "
        "(gpu_id WITH =, int4range(share_from, share_to, '[)') WITH &&, "
        "tstzrange(starts_at, ends_at, '[)') WITH &&)"
    )


def charge_existing(apps, schema_editor):
    schema_editor.execute("UPDATE allocations_reservation SET ge = gpus")


class Migration(migrations.Migration):

    dependencies = [
        ("allocations", "0008_teams_app"),
        ("inventory", "0005_gpu_models_and_mig_devices"),
    ]

    operations = [
        migrations.RenameField(model_name="quota", old_name="max_gpus", new_name="max_ge"),
        migrations.AlterField(
            model_name="quota", name="max_ge",
            field=models.DecimalField(decimal_places=2, max_digits=8, validators=[MinValueValidator(0)],
                                      help_text="Most GPU-equivalents the team may hold in this pool at any moment"),
        ),
        migrations.RenameField(model_name="quota", old_name="gpu_hours_per_month", new_name="ge_hours_per_month"),
        migrations.AlterField(
            model_name="quota", name="ge_hours_per_month",
            field=models.DecimalField(blank=True, decimal_places=1, max_digits=10, null=True,
                                      validators=[MinValueValidator(0)],
                                      help_text="GE-hours the team may book per calendar month (UTC); empty = no limit"),
        ),
        migrations.AddField(model_name="reservation", name="mode",
                            field=models.CharField(db_default="exclusive", default="exclusive", max_length=16)),
        migrations.AddField(model_name="reservation", name="shares",
                            field=models.PositiveSmallIntegerField(blank=True, null=True)),
        migrations.AddField(model_name="reservation", name="mig_profile",
                            field=models.CharField(blank=True, db_default="", default="", max_length=32)),
        migrations.AddField(model_name="reservation", name="mig_count",
                            field=models.PositiveSmallIntegerField(blank=True, null=True)),
        migrations.AddField(model_name="reservation", name="gpu_memory_mib",
                            field=models.PositiveIntegerField(blank=True, null=True)),
        migrations.AddField(model_name="reservation", name="gpu_cores_pct",
                            field=models.PositiveSmallIntegerField(blank=True, null=True)),
        migrations.AddField(
            model_name="reservation", name="ge",
            field=models.FloatField(db_default=0, default=0,
                                    help_text="GPU-equivalents its grants were charged (weights applied)")),
        migrations.RunPython(charge_existing, migrations.RunPython.noop),
        migrations.AddField(
            model_name="allocation", name="mode",
            field=models.CharField(db_default="exclusive", default="exclusive", max_length=16,
                                   help_text="The pool's sharing mode when the grant was made")),
        migrations.AddField(
            model_name="allocation", name="ge",
            field=models.FloatField(db_default=1.0, default=1.0, help_text="GPU-equivalents charged for it")),
        migrations.RunPython(guard_vgpu, unguard_vgpu),
    ]
