"""Notifications beyond the usual mail: to the channels teams and people set up (e-mail addresses,
signed webhooks, Slack, DingTalk, WeCom, Feishu/Lark), for the events each channel lists.

`notify` is called inside the write that decided the event: it records one Delivery per channel, and
each is sent after the commit by a task (teams.tasks.deliver). The Delivery row is the truth: a failed
attempt is tried again with a doubling wait, a lost task is picked up by the beat sweep
(teams.tasks.deliveries_due), and a channel that keeps failing is marked (failing_since, last_error) for
its owners to see. Nothing here ever raises into the caller or holds it up: the event happened
whatever a chat server says.

The usual mails (common.notifications) go out as before; channels add destinations.

Language: a channel is read in one language, chosen per channel when the event is recorded and again
when the wrapper words of its format are written (channel_language): a person's channel in that
person's saved language (teams.preferences.speaking_to), a team's channel in the portal's default
language (settings.LANGUAGE_CODE), which the operators chose for the site. A team's members may each
prefer another language, and a chat group reads one message: following the site's language keeps a
team channel's messages in one language that no single member's preference changes. The caller passes
`subject` and `text` as zero-argument callables (or lazy strings) that build the words with gettext, so
each channel gets them in its own language; a plain str is sent as it is.
"""
from __future__ import annotations

import base64
import hashlib
import hmac
import ipaddress
import json
import logging
import socket
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from datetime import timedelta
from urllib.parse import quote, urlsplit

import requests
from django.conf import settings
from django.core.mail import send_mail
from django.db.models import Q, Value
from django.db.models.functions import Coalesce
from django.utils import timezone, translation
from django.utils.functional import Promise
from django.utils.translation import gettext as _, gettext_lazy

from common import crypto
from common.dispatch import enqueue_after_commit
from teams.models import Delivery, NotificationChannel
from teams.preferences import speaking_to

log = logging.getLogger(__name__)

# The events a channel may receive: name → what people read in the channel form.
EVENTS = {
    "reservation.active": gettext_lazy("A reservation went active"),
    "reservation.failed": gettext_lazy("A reservation failed"),
    "reservation.expiring": gettext_lazy("A reservation ends soon"),
    "reservation.moved": gettext_lazy("A reservation moved off a failed node"),
    "reservation.preempted": gettext_lazy("GPUs of a reservation are being taken back (borrowed or preempted)"),
    "reservation.notice_withdrawn": gettext_lazy("A reclaim notice was withdrawn: its GPUs stay"),
    "reservation.queued_started": gettext_lazy("A queued request started"),
    "reservation.not_started": gettext_lazy("A queued request gave up"),
    "reservation.idle_warning": gettext_lazy("A reservation sits idle and will be released"),
    "reservation.idle_released": gettext_lazy("A reservation was released as idle"),
    "reservation.promise_moved": gettext_lazy("A queued request's promised start moved later"),
    "alert.firing": gettext_lazy("An alert fired"),
    "alert.resolved": gettext_lazy("An alert resolved"),
}
TEST_EVENT = "test"
CLAIM_SECONDS = 120  # how long an attempt holds its delivery before the sweep may try it again


class DeliveryFailed(Exception):
    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


# What a notification says: a str (sent as it is), a lazy gettext string, or a callable building the words
# with gettext (called once per channel, in that channel's language).
Words = str | Promise | Callable[[], str]


@contextmanager
def channel_language(channel: NotificationChannel) -> Iterator[None]:
    """Within the block, gettext speaks the channel's language: a person's channel its owner's (their saved
    language and zone), a team's channel the portal's default language (see the module's docstring)."""
    if channel.user_id is not None:
        with speaking_to(channel.user):
            yield
    else:
        with translation.override(settings.LANGUAGE_CODE):
            yield


def _said(words: Words) -> str:
    return words() if callable(words) else str(words)


def notify(*, event: str, subject: Words, text: Words, link: str = "", data: dict | None = None,
           team_ids: Iterable[int] = (), user_ids: Iterable[int] = ()) -> int:
    """Record a delivery of `event` to every enabled channel of these teams and people that lists it;
    each is sent after the commit. Returns how many were recorded. `subject` and `text` are put in
    words once per channel, in its language (channel_language)."""
    team_ids, user_ids = {t for t in team_ids if t}, {u for u in user_ids if u}
    if not team_ids and not user_ids:
        return 0
    channels = [channel for channel in NotificationChannel.objects.select_related("user").filter(enabled=True)
                .filter(Q(team_id__in=team_ids) | Q(user_id__in=user_ids)) if event in (channel.events or [])]
    deliveries = []
    for channel in channels:
        with channel_language(channel):
            payload = {"subject": _said(subject), "text": _said(text), "link": link, "data": data or {}}
        deliveries.append(Delivery(channel=channel, event=event, payload=payload, next_attempt_at=timezone.now()))
    made = Delivery.objects.bulk_create(deliveries)
    for delivery in made:
        enqueue_after_commit("teams.tasks.deliver", delivery.pk)
    return len(made)


def send_test(channel: NotificationChannel) -> Delivery:
    """A delivery of the `test` event to one channel, sent after the commit like any other."""
    with channel_language(channel):
        payload = {"subject": _("Test of channel %(name)s") % {"name": channel.name},
                   "link": settings.PORTAL_BASE_URL, "data": {},
                   "text": _("If you read this, GPU Pool Portal can reach this channel.")}
    delivery = Delivery.objects.create(channel=channel, event=TEST_EVENT, next_attempt_at=timezone.now(),
                                       payload=payload)
    enqueue_after_commit("teams.tasks.deliver", delivery.pk)
    return delivery


# --- sending ---------------------------------------------------------------------------------------

def _refuse_private(url: str) -> None:
    """Webhook URLs are set by members: unless NOTIFY_ALLOW_PRIVATE_URLS, one that leads to a loopback,
    private or link-local address (the portal's own database, a cloud metadata service) is refused."""
    if settings.NOTIFY_ALLOW_PRIVATE_URLS:
        return
    host = urlsplit(url).hostname or ""
    try:
        addresses = {info[4][0] for info in socket.getaddrinfo(host, None)}
    except OSError as error:
        raise DeliveryFailed(f"cannot resolve {host}: {error}") from error
    for address in addresses:
        ip = ipaddress.ip_address(address.split("%")[0])
        if ip.is_private or ip.is_loopback or ip.is_link_local or ip.is_reserved or ip.is_multicast:
            raise DeliveryFailed(f"{host} resolves to a private address ({ip}); not sent")


def _text(delivery: Delivery) -> str:
    payload = delivery.payload
    return "\n".join(part for part in (payload["subject"], payload["text"], payload.get("link")) if part)


def signature(secret: str, timestamp: str, body: bytes) -> str:
    """The generic webhook's X-GpuPool-Signature: HMAC-SHA256 of "<timestamp>.<body>" with the channel's
    secret, hex, prefixed "sha256=". A receiver recomputes it and refuses old timestamps (replays)."""
    mac = hmac.new(secret.encode(), timestamp.encode() + b"." + body, hashlib.sha256)
    return "sha256=" + mac.hexdigest()


def _request(delivery: Delivery, url: str, secret: str) -> tuple[str, dict, bytes]:
    """(url, headers, body) in the channel kind's own format."""
    kind, payload, text = delivery.channel.kind, delivery.payload, _text(delivery)
    headers = {"Content-Type": "application/json", "User-Agent": "gpupool-portal"}
    Kind = NotificationChannel.Kind
    if kind == Kind.WEBHOOK:
        body = json.dumps({"id": delivery.pk, "event": delivery.event, "at": delivery.created_at.isoformat(),
                           **payload}, separators=(",", ":")).encode()
        timestamp = str(int(time.time()))
        headers.update({"X-GpuPool-Event": delivery.event, "X-GpuPool-Delivery": str(delivery.pk),
                        "X-GpuPool-Timestamp": timestamp})
        if secret:
            headers["X-GpuPool-Signature"] = signature(secret, timestamp, body)
        return url, headers, body
    if kind == Kind.SLACK:
        opens = _("Open in GPU Pool Portal")
        link = f"\n<{payload['link']}|{opens}>" if payload.get("link") else ""
        return url, headers, json.dumps({"text": f"*{payload['subject']}*\n{payload['text']}{link}"}).encode()
    if kind in (Kind.DINGTALK, Kind.WECOM):
        if kind == Kind.DINGTALK and secret:
            # DingTalk's signed robots: milliseconds and base64(HMAC-SHA256 of "<ms>\n<secret>") in the URL.
            millis = str(int(time.time() * 1000))
            mac = hmac.new(secret.encode(), f"{millis}\n{secret}".encode(), hashlib.sha256).digest()
            url += f"{'&' if '?' in url else '?'}timestamp={millis}&sign={quote(base64.b64encode(mac).decode())}"
        return url, headers, json.dumps({"msgtype": "text", "text": {"content": text}}, ensure_ascii=False).encode()
    if kind == Kind.FEISHU:
        body = {"msg_type": "text", "content": {"text": text}}
        if secret:
            # Feishu/Lark signed bots: seconds, and base64(HMAC-SHA256 keyed by "<s>\n<secret>" over nothing).
            seconds = str(int(time.time()))
            mac = hmac.new(f"{seconds}\n{secret}".encode(), b"", hashlib.sha256).digest()
            body.update(timestamp=seconds, sign=base64.b64encode(mac).decode())
        return url, headers, json.dumps(body, ensure_ascii=False).encode()
    raise DeliveryFailed(f"unknown channel kind {kind}")


def _chat_refusal(kind: str, answer: requests.Response) -> str | None:
    """Chat robots answer 200 with an error code in the body when they refuse a message."""
    if kind not in ("dingtalk", "wecom", "feishu"):
        return None
    try:
        body = answer.json()
    except ValueError:
        return None
    code = body.get("errcode", body.get("code", body.get("StatusCode", 0)))
    return None if code in (0, None) else f"refused: {body.get('errmsg') or body.get('msg') or code}"


def _send(delivery: Delivery) -> int | None:
    channel = delivery.channel
    if channel.kind == NotificationChannel.Kind.EMAIL:
        send_mail(f"[GPU Pool] {delivery.payload['subject']}", _text(delivery), settings.DEFAULT_FROM_EMAIL,
                  [channel.email])
        return None
    url = crypto.decrypt(channel.url_encrypted)
    secret = crypto.decrypt(channel.secret_encrypted) if channel.secret_encrypted else ""
    _refuse_private(url)
    with channel_language(channel):  # the words a format adds around the payload (Slack's link)
        url, headers, body = _request(delivery, url, secret)
    try:
        answer = requests.post(url, data=body, headers=headers, timeout=settings.NOTIFY_TIMEOUT_SECONDS,
                               allow_redirects=False)
    except requests.RequestException as error:
        raise DeliveryFailed(f"{type(error).__name__}: {error}") from error
    if answer.status_code >= 300:
        raise DeliveryFailed(f"HTTP {answer.status_code}: {answer.text[:200]}", answer.status_code)
    refused = _chat_refusal(channel.kind, answer)
    if refused:
        raise DeliveryFailed(refused, answer.status_code)
    return answer.status_code


def delivery_attempt(delivery_id: int) -> str | None:
    """Try one delivery once, if it is due and nobody else holds it; record the outcome on it and on its
    channel. Returns its status after the attempt (None: not due, or held by another attempt)."""
    now = timezone.now()
    # Claimed by a conditional update, so the task and the sweep never send one delivery twice at once.
    claimed = Delivery.objects.filter(pk=delivery_id, status=Delivery.Status.PENDING, next_attempt_at__lte=now
                                      ).update(next_attempt_at=now + timedelta(seconds=CLAIM_SECONDS))
    if not claimed:
        return None
    delivery = Delivery.objects.select_related("channel").get(pk=delivery_id)
    channel = delivery.channel
    delivery.attempts += 1
    try:
        delivery.response_status = _send(delivery)
    except Exception as error:  # noqa: BLE001 - any failure is the channel's, recorded, never raised
        delivery.last_error = str(error)[:1000]
        delivery.response_status = getattr(error, "status", None)
        if delivery.attempts >= settings.NOTIFY_ATTEMPTS:
            delivery.status, delivery.next_attempt_at = Delivery.Status.GIVEN_UP, None
        else:
            wait = settings.NOTIFY_RETRY_SECONDS * 2 ** (delivery.attempts - 1)
            delivery.next_attempt_at = timezone.now() + timedelta(seconds=wait)
        # failing_since keeps the first failure of the run (one UPDATE, whatever another attempt wrote).
        NotificationChannel.objects.filter(pk=channel.pk).update(
            last_attempt_at=now, last_error=delivery.last_error, failing_since=Coalesce("failing_since", Value(now)))
        log.warning("delivery %s of %s to channel %s failed (attempt %s): %s", delivery.pk, delivery.event,
                    channel.pk, delivery.attempts, delivery.last_error)
    else:
        delivery.status, delivery.next_attempt_at, delivery.last_error = Delivery.Status.SENT, None, ""
        delivery.delivered_at = timezone.now()
        NotificationChannel.objects.filter(pk=channel.pk).update(last_attempt_at=now, last_error="",
                                                                 failing_since=None)
    delivery.save(update_fields=["attempts", "status", "next_attempt_at", "response_status", "last_error",
                                 "delivered_at"])
    return delivery.status


def due_deliveries(now=None, limit: int = 500) -> list[int]:
    """The pending deliveries whose next attempt is due (the beat sweep queues them)."""
    now = now or timezone.now()
    return list(Delivery.objects.filter(status=Delivery.Status.PENDING, next_attempt_at__lte=now)
                .order_by("next_attempt_at").values_list("pk", flat=True)[:limit])
