"""Migration operations the portal's own migrations share."""
from __future__ import annotations

from django.db import migrations


class AddIndexConcurrently(migrations.AddIndex):
    """AddIndex built with CREATE INDEX CONCURRENTLY on PostgreSQL, a plain CREATE INDEX elsewhere.

    A portal that has run for a while holds millions of reservation and allocation rows; a plain
    CREATE INDEX locks out writes while it builds, so reservations would fail during the upgrade.
    Django's own AddIndexConcurrently runs on PostgreSQL only, and the embedded demo is SQLite.
    The migration holding it must say `atomic = False` (CONCURRENTLY cannot run in a transaction).
    """

    def _concurrently(self, schema_editor) -> dict:
        return {"concurrently": True} if schema_editor.connection.vendor == "postgresql" else {}

    def database_forwards(self, app_label, schema_editor, from_state, to_state):
        model = to_state.apps.get_model(app_label, self.model_name)
        if self.allow_migrate_model(schema_editor.connection.alias, model):
            schema_editor.add_index(model, self.index, **self._concurrently(schema_editor))

    def database_backwards(self, app_label, schema_editor, from_state, to_state):
        model = from_state.apps.get_model(app_label, self.model_name)
        if self.allow_migrate_model(schema_editor.connection.alias, model):
            schema_editor.remove_index(model, self.index, **self._concurrently(schema_editor))
