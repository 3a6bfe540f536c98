"""Withdrawn reclaim notices get their own event, reservation.notice_withdrawn; until now they were sent as
reservation.preempted. A channel that listed that one keeps hearing them: it lists the new one too."""
from django.db import migrations

PREEMPTED, WITHDRAWN = "reservation.preempted", "reservation.notice_withdrawn"


def forwards(apps, schema_editor):
    NotificationChannel = apps.get_model("teams", "NotificationChannel")
    for channel in NotificationChannel.objects.all().only("pk", "events"):
        events = list(channel.events or [])
        if PREEMPTED in events and WITHDRAWN not in events:
            NotificationChannel.objects.filter(pk=channel.pk).update(events=[*events, WITHDRAWN])


def backwards(apps, schema_editor):
    NotificationChannel = apps.get_model("teams", "NotificationChannel")
    for channel in NotificationChannel.objects.all().only("pk", "events"):
        events = list(channel.events or [])
        if WITHDRAWN in events:
            NotificationChannel.objects.filter(pk=channel.pk).update(events=[e for e in events if e != WITHDRAWN])


class Migration(migrations.Migration):

    dependencies = [("teams", "0008_translated_labels")]

    operations = [migrations.RunPython(forwards, backwards)]
