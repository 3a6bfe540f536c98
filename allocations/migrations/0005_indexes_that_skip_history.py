# Indexes that let the per-request reads skip a team's history (see benchmarks/history.py), built
# without locking out writes on PostgreSQL, where these tables are large.

from django.conf import settings
from django.db import migrations, models

from common.migration_operations import AddIndexConcurrently


class Migration(migrations.Migration):
    atomic = False  # CREATE INDEX CONCURRENTLY cannot run inside a transaction

    dependencies = [
        ('allocations', '0004_lease_failures'),
        ('inventory', '0004_pool_policy_portal_by_default'),
        ('portal', '0001_initial'),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        AddIndexConcurrently(
            model_name='allocation',
            index=models.Index(fields=['ends_at', 'starts_at'], name='allocation_window'),
        ),
        AddIndexConcurrently(
            model_name='reservation',
            index=models.Index(fields=['team', 'pool', 'ends_at'], name='reservation_team_pool_end'),
        ),
        AddIndexConcurrently(
            model_name='reservation',
            index=models.Index(fields=['team', '-starts_at', '-id'], name='reservation_team_newest'),
        ),
        AddIndexConcurrently(
            model_name='reservation',
            index=models.Index(fields=['team', '-ended_at', '-id'], name='reservation_team_ended'),
        ),
    ]
