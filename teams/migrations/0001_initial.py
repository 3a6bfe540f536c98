"""Teams, members and API tokens move here from the `portal` app: the same rows, tables renamed.

The models are created in the migration state only, on the tables `portal` made
(portal_team, portal_membership, portal_apitoken); then the tables take this app's names
(AlterModelTable: ALTER TABLE ... RENAME, which PostgreSQL's and SQLite's foreign keys
follow). It runs after the last migration that made a table pointing at portal_team, whose
name is stale in the state from here on. The content types of the three models move with
them, so their permissions and the admin's log keep pointing at them. The other apps'
foreign keys change in their state only (allocations 0008, monitoring 0005); `portal` 0003
then forgets the models. Going back renames the tables and the content types back.
Index names keep their portal_ prefix: nothing reads them.
"""
import django.db.models.deletion
import django.utils.timezone
from django.conf import settings
from django.db import migrations, models

MODELS = ("team", "membership", "apitoken")


def content_types_follow(from_app: str, to_app: str):
    def move(apps, schema_editor) -> None:
        ContentType = apps.get_model("contenttypes", "ContentType")
        types = ContentType.objects.db_manager(schema_editor.connection.alias)
        for model in MODELS:
            if types.filter(app_label=to_app, model=model).exists():
                # Already made (a migrate run without this one, then post_migrate): the old one is stale.
                types.filter(app_label=from_app, model=model).delete()
            else:
                types.filter(app_label=from_app, model=model).update(app_label=to_app)
        types.clear_cache()

    return move


class Migration(migrations.Migration):

    initial = True

    dependencies = [
        ("portal", "0002_api_tokens"),
        # Every table with a foreign key to portal_team exists before it is renamed: a later
        # migration of these apps would build its key from the state's stale name (portal_team).
        ("allocations", "0007_grants"),
        ("monitoring", "0004_sample_composite_primary_key"),
        ("contenttypes", "0002_remove_content_type_name"),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.CreateModel(
                    name='Membership',
                    fields=[
                        ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                        ('role', models.CharField(choices=[('member', 'Member'), ('manager', 'Manager')], default='member', max_length=16)),
                        ('joined_at', models.DateTimeField(auto_now_add=True)),
                        ('user', models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='memberships', to=settings.AUTH_USER_MODEL)),
                    ],
                    options={
                        'ordering': ['team__slug', 'user__username'],
                        'db_table': 'portal_membership',
                    },
                ),
                migrations.CreateModel(
                    name='Team',
                    fields=[
                        ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                        ('slug', models.SlugField(max_length=64, unique=True)),
                        ('name', models.CharField(max_length=128)),
                        ('created_at', models.DateTimeField(auto_now_add=True)),
                        ('members', models.ManyToManyField(related_name='teams', through='teams.Membership', to=settings.AUTH_USER_MODEL)),
                    ],
                    options={
                        'ordering': ['slug'],
                        'db_table': 'portal_team',
                    },
                ),
                migrations.AddField(
                    model_name='membership',
                    name='team',
                    field=models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='memberships', to='teams.team'),
                ),
                migrations.AddConstraint(
                    model_name='membership',
                    constraint=models.UniqueConstraint(fields=('user', 'team'), name='one_membership_per_user_and_team'),
                ),
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
                        'db_table': 'portal_apitoken',
                    },
                ),
            ],
            database_operations=[],
        ),
        migrations.AlterModelTable(name='team', table=None),
        migrations.AlterModelTable(name='membership', table=None),
        migrations.AlterModelTable(name='apitoken', table=None),
        migrations.RunPython(content_types_follow("portal", "teams"), content_types_follow("teams", "portal")),
    ]
