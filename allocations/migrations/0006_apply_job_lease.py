# A running apply job's claim carries a lease (allocations/apply/jobs.py): a nullable column, so
# adding it rewrites nothing; rows claimed before it keep the old deadline-based take-back.

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('allocations', '0005_indexes_that_skip_history'),
    ]

    operations = [
        migrations.AddField(
            model_name='applyjob',
            name='lease_until',
            field=models.DateTimeField(
                blank=True, null=True,
                help_text="running: the claim's lease, renewed while the attempt runs; lapsed, the sweep takes "
                          "the job back"),
        ),
    ]
