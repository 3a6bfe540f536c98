"""Team, Membership and ApiToken now belong to the `teams` app (teams 0001 took their tables): the
models leave this app's state, and nothing in the database changes."""
from django.db import migrations


class Migration(migrations.Migration):

    dependencies = [
        ('portal', '0002_api_tokens'),
        ('teams', '0001_initial'),
        # No state may still point at portal.Team when it goes.
        ('allocations', '0008_teams_app'),
        ('monitoring', '0005_teams_app'),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.DeleteModel(name='ApiToken'),
                migrations.RemoveField(model_name='team', name='members'),
                migrations.DeleteModel(name='Membership'),
                migrations.DeleteModel(name='Team'),
            ],
            database_operations=[],
        ),
    ]
