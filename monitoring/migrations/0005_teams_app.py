"""Alerts point at teams.Team, which is the same table renamed (teams 0001): state only."""
import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('monitoring', '0004_sample_composite_primary_key'),
        ('teams', '0001_initial'),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.AlterField(
                    model_name='alert',
                    name='team',
                    field=models.ForeignKey(blank=True, null=True, on_delete=django.db.models.deletion.SET_NULL, related_name='+', to='teams.team'),
                ),
            ],
            database_operations=[],
        ),
    ]
