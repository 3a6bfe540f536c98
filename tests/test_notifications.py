"""common.notifications: a mail goes out only if the write that decided it commits, and a mail server's
failure never undoes that write."""
from __future__ import annotations

import pytest
from django.core import mail
from django.db import transaction

from common.notifications import mail_after_commit
from teams.models import Team
from tests.conftest import free_port

CONTEXT = {"reservation": None, "headline": "Moved", "detail": "Its node failed.", "link": "http://x/"}


def notify(to=("a@example.com",)) -> bool:
    return mail_after_commit(to=to, subject="[GPU Pool] Moved", template="allocations/email/reservation_notice",
                             context=CONTEXT, about="a test")


@pytest.mark.django_db(transaction=True)
def test_it_sends_after_the_commit_and_not_after_a_rollback():
    with pytest.raises(RuntimeError), transaction.atomic():
        notify()
        raise RuntimeError("the write failed")
    assert mail.outbox == []
    with transaction.atomic():
        notify()
        assert mail.outbox == []  # not before the commit
    assert len(mail.outbox) == 1 and mail.outbox[0].to == ["a@example.com"]
    assert "Its node failed." in mail.outbox[0].body and mail.outbox[0].alternatives[0][1] == "text/html"


def test_it_sends_nothing_when_nobody_has_an_address(db):
    assert notify(to=["", ""]) is False
    assert mail.outbox == []


@pytest.mark.django_db(transaction=True)
def test_a_mail_server_that_refuses_does_not_undo_the_write(settings):
    settings.EMAIL_BACKEND = "django.core.mail.backends.smtp.EmailBackend"
    settings.EMAIL_HOST, settings.EMAIL_PORT, settings.EMAIL_TIMEOUT = "127.0.0.1", free_port(), 2  # nothing listens
    with transaction.atomic():
        Team.objects.create(slug="kept", name="Kept")
        assert notify() is True
    assert Team.objects.filter(slug="kept").exists()


def test_the_notice_template_speaks_the_recipients_language(db):
    from django.template.loader import render_to_string
    from django.utils import translation

    context = {**CONTEXT, "portal_url": "http://x"}
    with translation.override("zh-hans"):
        html = render_to_string("allocations/email/reservation_notice.html", context)
        text = render_to_string("allocations/email/reservation_notice.txt", context)
    assert "打开预约" in html and "你收到此邮件是因为你预约了它或管理其团队" in text
    english = render_to_string("allocations/email/reservation_notice.html", context)
    assert "Open the reservation" in english and "打开预约" not in english
