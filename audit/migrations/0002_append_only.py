"""Audit entries are append-only in the database itself: on PostgreSQL a trigger refuses every UPDATE
and every DELETE of an audit row, whoever sends it (the application, a shell, a script).

One DELETE goes through: that of a row older than `audit.retention_days` days, in a transaction that
set that variable (audit.services.audit_entries_delete_expired, the retention task's one path). Code
that does not set it cannot delete; code that sets it can delete only what the retention would delete
anyway, never a recent entry. TRUNCATE is not a row change and stays an administrator's (and the test
runner's) tool. SQLite (the embedded demo) has no such variable: there the model refuses instead
(audit.models.AuditEntryQuerySet).
"""
from django.db import migrations

FORWARDS = """
CREATE FUNCTION audit_entry_append_only() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    retention_days integer := NULLIF(current_setting('audit.retention_days', true), '')::integer;
BEGIN
    IF TG_OP = 'DELETE' AND retention_days >= 1
       AND OLD."timestamp" < now() - make_interval(days => retention_days) THEN
        RETURN OLD;
    END IF;
    RAISE EXCEPTION 'audit entries are append-only: % refused', TG_OP
        USING ERRCODE = 'insufficient_privilege',
              HINT = 'Only the retention task deletes entries, and only those past the retention.';
END;
$$;
CREATE TRIGGER audit_entry_append_only BEFORE UPDATE OR DELETE ON audit_auditentry
    FOR EACH ROW EXECUTE FUNCTION audit_entry_append_only();
"""

BACKWARDS = """
DROP TRIGGER IF EXISTS audit_entry_append_only ON audit_auditentry;
DROP FUNCTION IF EXISTS audit_entry_append_only();
"""


def _on_postgresql(sql):
    def run(apps, schema_editor):
        if schema_editor.connection.vendor == "postgresql":
            schema_editor.execute(sql, params=None)  # no parameters: its % is plpgsql's
    return run


class Migration(migrations.Migration):
    dependencies = [("audit", "0001_initial")]

    operations = [migrations.RunPython(_on_postgresql(FORWARDS), _on_postgresql(BACKWARDS))]
