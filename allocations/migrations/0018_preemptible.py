from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('allocations', '0017_queue_planned_gpus'),
    ]

    operations = [
        migrations.AddField(
            model_name='priorityclass',
            name='preemptible',
            field=models.BooleanField(db_default=False, default=False, help_text="Its bookings may be taken back, after a notice, for a request of a higher class within its team's quota"),
        ),
        migrations.AddField(
            model_name='reservation',
            name='preemptible',
            field=models.BooleanField(db_default=False, default=False, help_text="Its priority class was preemptible when it was asked: a request of a higher class within its team's quota may take it back after a notice"),
        ),
    ]
