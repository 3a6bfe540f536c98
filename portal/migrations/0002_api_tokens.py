"""API tokens of our own, stored as prefix + SHA-256; DRF's plain-text tokens move into them and their table goes.

Keys handed out before keep working: each `authtoken_token` row becomes an ApiToken with the
key's prefix and digest (common.secrets, the rule the code checks with), then the table,
its migration records and its content types are dropped (rest_framework.authtoken is no
longer installed, so nothing else would). On a database that never had the table there is
nothing to move. Going back keeps the hashed tokens: the keys are not there to restore.
"""
import datetime

import django.db.models.deletion
import django.utils.timezone
from django.conf import settings
from django.db import migrations, models
from django.utils.dateparse import parse_datetime

from common.secrets import key_digest, key_prefix

DRF_TABLE = "authtoken_token"


def _aware(value) -> datetime.datetime:
    if isinstance(value, str):  # SQLite hands raw timestamps back as text
        value = parse_datetime(value)
    if value is None:
        return django.utils.timezone.now()
    return value if django.utils.timezone.is_aware(value) else value.replace(tzinfo=datetime.timezone.utc)


def move_drf_tokens(apps, schema_editor) -> None:
    connection = schema_editor.connection
    with connection.cursor() as cursor:
        if DRF_TABLE not in connection.introspection.table_names(cursor):
            return
        cursor.execute(f"SELECT {connection.ops.quote_name('key')}, user_id, created FROM {DRF_TABLE}")
        rows = cursor.fetchall()
    ApiToken = apps.get_model("portal", "ApiToken")
    ApiToken.objects.using(connection.alias).bulk_create(
        ApiToken(user_id=user_id, name="before hashing", prefix=key_prefix(key), digest=key_digest(key),
                 created_at=_aware(created))
        for key, user_id, created in rows
    )
    schema_editor.execute(f"DROP TABLE {DRF_TABLE}")
    schema_editor.execute("DELETE FROM django_migrations WHERE app = 'authtoken'")
    ContentType = apps.get_model("contenttypes", "ContentType")
    ContentType.objects.using(connection.alias).filter(app_label="authtoken").delete()


class Migration(migrations.Migration):

    dependencies = [
        ('portal', '0001_initial'),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
        ("auth", "0012_alter_user_first_name_max_length"),
        ("contenttypes", "0002_remove_content_type_name"),
        ("admin", "0003_logentry_add_action_flag_choices"),
    ]

    operations = [
        migrations.CreateModel(
            name='ApiToken',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('name', models.CharField(blank=True, max_length=64)),
                ('prefix', models.CharField(editable=False, max_length=12, unique=True)),
                ('digest', models.CharField(editable=False, max_length=64)),
                ('created_at', models.DateTimeField(default=django.utils.timezone.now, editable=False)),
                ('last_used_at', models.DateTimeField(blank=True, editable=False, null=True)),
                ('user', models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='api_tokens', to=settings.AUTH_USER_MODEL)),
            ],
            options={
                'ordering': ['user_id', '-created_at'],
            },
        ),
        migrations.RunPython(move_drf_tokens, migrations.RunPython.noop),
    ]
