"""Quotas and reservations point at teams.Team, which is the same table renamed (teams 0001): state only."""
import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('allocations', '0007_grants'),
        ('teams', '0001_initial'),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.AlterField(
                    model_name='quota',
                    name='team',
                    field=models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='quotas', to='teams.team'),
                ),
                migrations.AlterField(
                    model_name='reservation',
                    name='team',
                    field=models.ForeignKey(on_delete=django.db.models.deletion.PROTECT, related_name='reservations', to='teams.team'),
                ),
            ],
            database_operations=[],
        ),
    ]
