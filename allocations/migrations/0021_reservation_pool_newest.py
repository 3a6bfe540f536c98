# A pool's newest reservations by id (allocations.profiles reads the last few hundred of a pool for its
# workload profile), built without locking out writes on PostgreSQL, where the table is large.

from django.db import migrations, models

from common.migration_operations import AddIndexConcurrently


class Migration(migrations.Migration):
    atomic = False  # CREATE INDEX CONCURRENTLY cannot run inside a transaction

    dependencies = [
        ('allocations', '0020_reservation_gpu_models'),
    ]

    operations = [
        AddIndexConcurrently(
            model_name='reservation',
            index=models.Index(fields=['pool', '-id'], name='reservation_pool_newest'),
        ),
    ]
