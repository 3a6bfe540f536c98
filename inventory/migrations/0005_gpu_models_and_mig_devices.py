from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ("inventory", "0004_pool_policy_portal_by_default"),
    ]

    operations = [
        migrations.AddField(
            model_name="gpu",
            name="mig_devices",
            field=models.JSONField(blank=True, default=list),
        ),
        migrations.CreateModel(
            name="GpuModel",
            fields=[
                ("id", models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name="ID")),
                ("name", models.CharField(max_length=128, unique=True)),
                ("weight", models.DecimalField(decimal_places=3, default=1, max_digits=6,
                                               help_text="GPU-equivalents one whole GPU of this model counts as (> 0)")),
                ("updated_at", models.DateTimeField(auto_now=True)),
            ],
            options={
                "verbose_name": "GPU model",
                "ordering": ["name"],
                "constraints": [models.CheckConstraint(condition=models.Q(("weight__gt", 0)),
                                                       name="gpu_model_weight_positive")],
            },
        ),
    ]
