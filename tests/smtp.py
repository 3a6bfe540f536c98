"""A real SMTP server (aiosmtpd) on a free port, for the tests that check the mails the portal sends."""
from __future__ import annotations

import email
import socket
from email import policy

from aiosmtpd.controller import Controller


class Inbox:
    """What the server received: (recipients, message) in the order it arrived."""

    def __init__(self) -> None:
        self.messages: list[tuple[list[str], email.message.EmailMessage]] = []

    async def handle_DATA(self, server, session, envelope):
        self.messages.append((list(envelope.rcpt_tos), email.message_from_bytes(envelope.content,
                                                                                 policy=policy.default)))
        return "250 OK"

    def subjects(self) -> list[str]:
        return [message["Subject"] for _, message in self.messages]


def start_smtp() -> tuple[Inbox, Controller, int]:
    """Start a server on a free port of 127.0.0.1; the caller stops the controller."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    inbox = Inbox()
    controller = Controller(inbox, hostname="127.0.0.1", port=port)
    controller.start()
    return inbox, controller, port
