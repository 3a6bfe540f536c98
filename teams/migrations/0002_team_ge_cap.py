from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ("teams", "0001_initial"),
    ]

    operations = [
        migrations.AddField(
            model_name="team",
            name="max_ge",
            field=models.DecimalField(
                blank=True, decimal_places=2, max_digits=8, null=True,
                help_text="Most GPU-equivalents (weights applied) the team may hold across all pools at once; "
                          "empty = no cap"),
        ),
    ]
