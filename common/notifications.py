"""Mail to people about something the portal did: the one home of every notification.

A notification is decided inside a write (a failover, an alert turning firing) and must
go out only if that write commits, and never undo it when the mail server is down. So
every notification goes through `mail_after_commit`: the text and HTML bodies are rendered
from `<template>.txt` and `<template>.html` (Django templates, so they translate with the
rest of the pages), and the message is sent once the current transaction commits (at once
outside one); a failure to send is logged, naming what the mail was about.
"""
from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any

from django.conf import settings
from django.core.mail import EmailMultiAlternatives
from django.db import transaction
from django.template.loader import render_to_string

log = logging.getLogger(__name__)

def mail_after_commit(*, to: Iterable[str], subject: str, template: str, context: dict[str, Any],
                      about: str) -> bool:
    """Send `template` to `to` after commit. Returns False (and sends nothing) when nobody has an address."""
    recipients = sorted({address for address in to if address})
    if not recipients:
        log.info("nobody to mail about %s", about)
        return False
    context = {**context, "portal_url": settings.PORTAL_BASE_URL}
    message = EmailMultiAlternatives(subject=subject,
                                     body=render_to_string(f"{template}.txt", context),
                                     from_email=settings.DEFAULT_FROM_EMAIL, to=recipients)
    message.attach_alternative(render_to_string(f"{template}.html", context), "text/html")

    def send() -> None:
        try:
            message.send()
        except Exception:  # noqa: BLE001 - a mail server's trouble must not undo or stop what was decided
            log.exception("could not mail %s about %s", recipients, about)

    transaction.on_commit(send)
    return True
