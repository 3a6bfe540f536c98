from celery import shared_task

from audit.services import audit_entries_delete_expired


@shared_task
def delete_expired_audit_entries() -> int:
    """Keep the audit log to AUDIT_RETENTION_DAYS (scheduled by config/celery.py)."""
    return audit_entries_delete_expired()
