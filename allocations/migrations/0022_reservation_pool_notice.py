# A pool's reservations under a reclaim notice (a queue pass reads them twice), as a partial index, built without
# locking out writes on PostgreSQL, where the table is large.

from django.db import migrations, models

from common.migration_operations import AddIndexConcurrently


class Migration(migrations.Migration):
    atomic = False  # CREATE INDEX CONCURRENTLY cannot run inside a transaction

    dependencies = [
        ('allocations', '0021_reservation_pool_newest'),
    ]

    operations = [
        AddIndexConcurrently(
            model_name='reservation',
            index=models.Index(condition=models.Q(('preempt_at__isnull', False)), fields=['pool'],
                               name='reservation_pool_notice'),
        ),
    ]
