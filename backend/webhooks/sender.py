"""Sending pending deliveries: claim the due ones, POST each, record what came back.

A pass claims a batch of due deliveries in one short transaction (PostgreSQL: `SELECT … FOR
UPDATE SKIP LOCKED`, so several senders take different rows; SQLite: Baton's transactions hold
the database write lock) and moves each one's `next_attempt_at` past the time the batch may
take, so no other sender takes it meanwhile. Then, outside any transaction, it POSTs each
delivery, and records the outcome fenced by the attempt it claimed: 2xx is `delivered`;
anything else, or no answer, is tried again after base × 2^(attempt−1) seconds (at most the
maximum), and is `failed` after BATON_WEBHOOK_MAX_ATTEMPTS attempts. A sender that dies
mid-batch leaves its deliveries to be sent again once the claim runs out: delivery is at least
once, and receivers deduplicate by `Baton-Delivery`.

Nothing here logs a payload, a URL, a secret or a signature: ids, status codes and counts.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import httpx
from django.conf import settings
from django.db import transaction
from django.db.models import F
from django.utils import timezone

from backend.events import log_event
from backend.webhooks.addresses import (
    BlockedAddress,
    PublicOnlyTransport,
    private_addresses_allowed,
)
from backend.webhooks.models import DeliveryStatus, WebhookDelivery
from backend.webhooks.services import signature_header

CLAIM_BATCH = 20
# Beyond the batch's worst case (every POST timing out), before its claim runs out.
CLAIM_MARGIN_SECONDS = 60.0
USER_AGENT = "Baton-Webhooks/1"


@dataclass(frozen=True)
class ClaimedDelivery:
    """One delivery a pass holds: everything needed to send it, read under the claim."""

    id: int
    attempt: int
    url: str
    secret: str
    event_type: str
    event_id: str
    body: bytes


@dataclass(frozen=True)
class PassSummary:
    delivered: int = 0
    retrying: int = 0
    failed: int = 0

    @property
    def sent(self) -> int:
        return self.delivered + self.retrying + self.failed


def backoff_seconds(*, attempt: int) -> float:
    """The wait after failed attempt number `attempt` (1-based)."""
    delay = settings.BATON_WEBHOOK_BACKOFF_SECONDS * (2 ** max(0, attempt - 1))
    return float(min(delay, settings.BATON_WEBHOOK_BACKOFF_MAX_SECONDS))


def claim_lease_seconds(*, batch: int) -> float:
    return batch * settings.BATON_WEBHOOK_TIMEOUT_SECONDS * 2 + CLAIM_MARGIN_SECONDS


def body_of(payload: Any) -> bytes:
    """The bytes sent and signed: compact JSON with sorted keys."""
    return json.dumps(payload, sort_keys=True, separators=(",", ":")).encode()


def claim_due(*, now: datetime, limit: int = CLAIM_BATCH) -> list[ClaimedDelivery]:
    """Claim up to `limit` pending deliveries due at `now` to active endpoints, oldest first;
    each one's attempt is counted now."""
    due = WebhookDelivery.objects.filter(
        status=DeliveryStatus.PENDING, next_attempt_at__lte=now, endpoint__active=True
    )
    # A plain read first: an idle sender polls without taking a lock (on SQLite, the database
    # write lock that every writer of turns needs).
    if not due.exists():
        return []
    with transaction.atomic():
        rows = list(
            due.select_for_update(skip_locked=True, of=("self",))
            .select_related("endpoint")
            .order_by("next_attempt_at", "id")[:limit]
        )
        if not rows:
            return []
        WebhookDelivery.objects.filter(pk__in=[row.pk for row in rows]).update(
            attempts=F("attempts") + 1,
            next_attempt_at=now + timedelta(seconds=claim_lease_seconds(batch=len(rows))),
            updated_at=now,
        )
    return [
        ClaimedDelivery(
            id=row.pk,
            attempt=row.attempts + 1,
            url=row.endpoint.url,
            secret=row.endpoint.secret,
            event_type=row.event_type,
            event_id=row.event_id,
            body=body_of(row.payload),
        )
        for row in rows
    ]


def post(
    *, client: httpx.Client, delivery: ClaimedDelivery, now: datetime
) -> tuple[int | None, str]:
    """POST the delivery; (status code, "") or (None, the error's type name)."""
    headers = {
        "Content-Type": "application/json",
        "User-Agent": USER_AGENT,
        "Baton-Event": delivery.event_type,
        "Baton-Delivery": delivery.event_id,
        "Baton-Signature": signature_header(
            secret=delivery.secret, body=delivery.body, timestamp=int(now.timestamp())
        ),
    }
    try:
        response = client.post(
            delivery.url,
            content=delivery.body,
            headers=headers,
            timeout=settings.BATON_WEBHOOK_TIMEOUT_SECONDS,
        )
    except (httpx.HTTPError, httpx.InvalidURL, BlockedAddress) as error:
        return None, type(error).__name__
    return response.status_code, ""


def record_attempt(
    *, delivery: ClaimedDelivery, status_code: int | None, error: str, now: datetime
) -> str:
    """Store the attempt's outcome, if the delivery is still this attempt's; returns the
    delivery's new status."""
    fields: dict[str, Any] = {"last_status_code": status_code, "updated_at": now}
    if status_code is not None and 200 <= status_code < 300:
        status = DeliveryStatus.DELIVERED
        fields.update(delivered_at=now, last_error="")
    else:
        fields["last_error"] = error or f"HTTP {status_code}"
        if delivery.attempt >= settings.BATON_WEBHOOK_MAX_ATTEMPTS:
            status = DeliveryStatus.FAILED
        else:
            status = DeliveryStatus.PENDING
            fields["next_attempt_at"] = now + timedelta(
                seconds=backoff_seconds(attempt=delivery.attempt)
            )
    WebhookDelivery.objects.filter(
        pk=delivery.id, attempts=delivery.attempt, status=DeliveryStatus.PENDING
    ).update(status=status, **fields)
    log_event(
        "webhook_attempt",
        delivery=delivery.id,
        attempt=delivery.attempt,
        status_code=status_code,
        error=error,
        outcome=str(status),
    )
    return status


def deliver_due(
    *, client: httpx.Client, now: datetime | None = None, limit: int = CLAIM_BATCH
) -> PassSummary:
    """One pass: claim the deliveries due at `now` (the clock's time by default) and send
    them. Tests pass `now` to step through backoff without waiting."""
    clock = now or timezone.now()
    counts = {DeliveryStatus.DELIVERED: 0, DeliveryStatus.PENDING: 0, DeliveryStatus.FAILED: 0}
    for delivery in claim_due(now=clock, limit=limit):
        sent_at = now or timezone.now()
        status_code, error = post(client=client, delivery=delivery, now=sent_at)
        outcome = record_attempt(
            delivery=delivery, status_code=status_code, error=error, now=now or timezone.now()
        )
        counts[DeliveryStatus(outcome)] += 1
    return PassSummary(
        delivered=counts[DeliveryStatus.DELIVERED],
        retrying=counts[DeliveryStatus.PENDING],
        failed=counts[DeliveryStatus.FAILED],
    )


def http_client() -> httpx.Client:
    """The sender's client: no redirects followed (a 3xx is a failed attempt), no proxies from
    the environment, and no connection to a private address unless
    BATON_WEBHOOK_ALLOW_PRIVATE_ADDRESSES (`backend.webhooks.addresses`)."""
    transport = None if private_addresses_allowed() else PublicOnlyTransport()
    return httpx.Client(follow_redirects=False, trust_env=False, transport=transport)
