"""Services that write webhook endpoints and deliveries.

`enqueue_turn_events` is called by the tasks services inside the transaction that ends a turn,
so a delivery exists exactly when the turn's new state was committed. It costs one indexed
query when the owner has no active endpoint, and one more (the insert) when it has.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import secrets
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from urllib.parse import urlsplit

from django.conf import settings
from django.contrib.auth.models import User
from django.core.exceptions import ValidationError
from django.core.validators import URLValidator
from django.db import connection
from django.db.models import Q
from django.urls import reverse

from backend import queries
from backend.errors import InvalidInput
from backend.webhooks.addresses import is_public, literal_address, private_addresses_allowed
from backend.webhooks.models import (
    ALL_EVENT_TYPES,
    URL_MAX_LENGTH,
    EventType,
    WebhookDelivery,
    WebhookEndpoint,
)

# The turn's final status (as the tasks app stores it) and the event that announces it.
EVENT_FOR_STATUS = {
    "COMPLETED": EventType.TURN_COMPLETED,
    "FAILED": EventType.TURN_FAILED,
    "CANCELLED": EventType.TURN_CANCELLED,
    # Stopped by a newer message: a cancellation the payload's status and error code tell apart.
    "INTERRUPTED": EventType.TURN_CANCELLED,
}

_url_validator = URLValidator(schemes=["http", "https"])


@dataclass(frozen=True)
class EndedTurn:
    """An assistant turn that has just ended, as the tasks app describes it (plain data: this
    package never imports the tasks app)."""

    subtask_id: int
    message_id: int
    status: str
    error_code: str
    bot: str
    pipeline_step: int | None


def new_secret() -> str:
    return "whsec_" + secrets.token_hex(32)


def event_id(*, subtask_id: int, event_type: str) -> str:
    """The same for every endpoint and every emission: a turn ends once."""
    return f"evt_{subtask_id}_{event_type.removeprefix('turn.')}"


def signature_header(*, secret: str, body: bytes, timestamp: int) -> str:
    """`Baton-Signature`: t=<unix seconds>,v1=<hex HMAC-SHA256 of "<t>.<raw body>">."""
    digest = hmac.new(
        secret.encode(), str(timestamp).encode() + b"." + body, hashlib.sha256
    ).hexdigest()
    return f"t={timestamp},v1={digest}"


def _validated_url(url: str) -> str:
    url = url.strip()
    if len(url) > URL_MAX_LENGTH:
        raise InvalidInput(f"url is longer than {URL_MAX_LENGTH} characters.", field="url")
    try:
        _url_validator(url)
    except ValidationError:
        raise InvalidInput("url must be an http:// or https:// URL.", field="url") from None
    address = literal_address(urlsplit(url).hostname or "")
    if address is not None and not private_addresses_allowed() and not is_public(address):
        raise InvalidInput(
            "url must reach a public address: webhooks are not sent to loopback, private or "
            "link-local addresses (BATON_WEBHOOK_ALLOW_PRIVATE_ADDRESSES).",
            field="url",
        )
    return url


def _validated_events(events: Sequence[str] | None) -> list[str]:
    if events is None:
        return list(ALL_EVENT_TYPES)
    if not events:
        raise InvalidInput("events must name at least one event.", field="events")
    unknown = [event for event in events if event not in ALL_EVENT_TYPES]
    if unknown:
        raise InvalidInput(
            f"events {unknown!r} are not among {', '.join(ALL_EVENT_TYPES)}.", field="events"
        )
    return [event for event in ALL_EVENT_TYPES if event in events]


def create_endpoint(
    *, owner: User, url: str, task_id: int | None = None, events: Sequence[str] | None = None
) -> WebhookEndpoint:
    """Register `url` for the owner's turns: one task's (`task_id`, which the caller has
    checked is the owner's) or every task's. The secret is generated here; the caller shows it
    once."""
    return WebhookEndpoint.objects.create(
        owner=owner,
        task_id=task_id,
        url=_validated_url(url),
        events=_validated_events(events),
        secret=new_secret(),
    )


def delete_endpoint(*, endpoint: WebhookEndpoint) -> None:
    """Remove the endpoint and its deliveries (sent or not)."""
    endpoint.delete()


def turn_page_path(*, task_id: int, message_id: int) -> str:
    """The page of the task's turns that holds turn `message_id` alone: a path, or a URL under
    BATON_PUBLIC_URL. Webhook bodies and event streams, written outside any request, link to a
    turn with it."""
    turns = reverse("task-subtasks", kwargs={"task_id": task_id})
    return f"{settings.BATON_PUBLIC_URL or ''}{turns}?after={message_id - 1}&page_size=1"


def _payload(
    *, event: str, task_id: int, turn: EndedTurn, occurred_at: datetime
) -> dict[str, object]:
    # Absolute with BATON_PUBLIC_URL (a body is sent outside any request, so no host is known).
    task_url = (settings.BATON_PUBLIC_URL or "") + reverse(
        "task-detail", kwargs={"task_id": task_id}
    )
    return {
        "id": event_id(subtask_id=turn.subtask_id, event_type=event),
        "type": event,
        "occurred_at": occurred_at.isoformat(),
        "task_id": task_id,
        "subtask_id": turn.subtask_id,
        "message_id": turn.message_id,
        "status": turn.status,
        "error_code": turn.error_code,
        "bot": turn.bot,
        "pipeline_step": turn.pipeline_step,
        "links": {
            "task": task_url,
            "turn": turn_page_path(task_id=task_id, message_id=turn.message_id),
        },
    }


def enqueue_turn_events(
    *, owner_id: int, task_id: int, turns: Iterable[EndedTurn], occurred_at: datetime
) -> int:
    """Write one pending delivery per ended turn and per active endpoint of the owner that
    hears the task and the event; returns how many were written.

    Call inside the transaction that ended the turns. `turns` is read only when an endpoint
    hears the task (it may be a lazy generator over a query). An event already written for an
    endpoint is not written again.
    """
    endpoints = _endpoints_hearing(owner_id=owner_id, task_id=task_id)
    if not endpoints:
        return 0
    deliveries = []
    for turn in turns:
        event = EVENT_FOR_STATUS.get(turn.status)
        if event is None:
            continue
        payload = _payload(event=event, task_id=task_id, turn=turn, occurred_at=occurred_at)
        event_key = event_id(subtask_id=turn.subtask_id, event_type=event)
        for endpoint_id, events in endpoints:
            if event in events:
                deliveries.append(
                    WebhookDelivery(
                        endpoint_id=endpoint_id,
                        event_type=event,
                        event_id=event_key,
                        task_id=task_id,
                        subtask_id=turn.subtask_id,
                        payload=payload,
                        next_attempt_at=occurred_at,
                        created_at=occurred_at,
                    )
                )
    if deliveries:
        WebhookDelivery.objects.bulk_create(deliveries, ignore_conflicts=True)
    return len(deliveries)


def _endpoints_hearing(*, owner_id: int, task_id: int) -> list[tuple[int, list[str]]]:
    """The owner's active endpoints that hear the task, newest first: (id, events heard).
    PostgreSQL runs the statement `endpoints_hearing_task`; SQLite the ORM's query."""
    if connection.vendor == "postgresql":
        rows = queries.fetch("endpoints_hearing_task", {"owner_id": owner_id, "task_id": task_id})
        # jsonb arrives as its text (Django's loader leaves decoding to the model's field).
        return [(endpoint_id, json.loads(events)) for endpoint_id, events in rows]
    return _endpoints_by_orm(owner_id=owner_id, task_id=task_id)


def _endpoints_by_orm(*, owner_id: int, task_id: int) -> list[tuple[int, list[str]]]:
    return list(
        WebhookEndpoint.objects.filter(owner_id=owner_id, active=True)
        .filter(Q(task_id__isnull=True) | Q(task_id=task_id))
        .order_by("-created_at", "-id")
        .values_list("id", "events")
    )
