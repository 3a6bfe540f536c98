"""The audit log: who changed what, when, from where (API, page, admin or a system task).

Built on django-auditlog (its model registry, its diff of a row before and after a save or delete,
its field exclusion), chosen over django-pghistory and django-simple-history because:
pghistory records through PostgreSQL triggers and does not run on the embedded SQLite mode
(`make run`); simple-history keeps one history table per model and no "changed fields" of its own,
where we want one log to filter by actor, object and time. auditlog works the same on SQLite and
PostgreSQL, keeps one table, and lets us bring our own entry model (AUDITLOG_LOGENTRY_MODEL), which
adds the `source` column and keeps entries apart from the rows they describe (no cascades).

Which models are tracked, and which of their fields never are (secrets, token digests, heartbeat
timestamps), is wiring: AUDIT_TRACKED_MODELS in config/settings.py, by label, registered with
auditlog by audit.apps, so this app imports none of the domain apps (they import it, to record what a
bulk update or a hand-written SQL statement changed).
"""
