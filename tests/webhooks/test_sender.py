"""The sender against a real receiver on 127.0.0.1: signatures, retries with backoff, the
final failure, and several senders at once. Time moves by passing `now`, never by sleeping."""

from __future__ import annotations

import hashlib
import hmac
import json
import threading
from datetime import timedelta

import pytest
from django.core.management import call_command
from django.db import connection
from django.utils import timezone

from backend.tasks.factories import answered_task
from backend.webhooks.models import WebhookDelivery
from backend.webhooks.sender import backoff_seconds, deliver_due, http_client
from backend.webhooks.services import create_endpoint


def verify(secret: str, headers: dict[str, str], body: bytes) -> bool:
    """What a receiver does (README, "Webhooks")."""
    parts = dict(item.split("=", 1) for item in headers["Baton-Signature"].split(","))
    expected = hmac.new(
        secret.encode(), parts["t"].encode() + b"." + body, hashlib.sha256
    ).hexdigest()
    return hmac.compare_digest(expected, parts["v1"])


@pytest.mark.django_db
def test_a_receiver_failing_twice_gets_exactly_one_successful_delivery(user, receiver, settings):
    settings.BATON_WEBHOOK_BACKOFF_SECONDS = 2
    receiver.script = [500, 500]
    endpoint = create_endpoint(owner=user, url=receiver.url)
    task = answered_task(owner=user)
    now = timezone.now()
    with http_client() as client:
        assert deliver_due(client=client, now=now).retrying == 1
        # Not due again before its backoff.
        assert deliver_due(client=client, now=now + timedelta(seconds=1)).sent == 0
        assert deliver_due(client=client, now=now + timedelta(seconds=2)).retrying == 1
        assert deliver_due(client=client, now=now + timedelta(seconds=5)).sent == 0
        assert deliver_due(client=client, now=now + timedelta(seconds=6)).delivered == 1
        assert deliver_due(client=client, now=now + timedelta(days=1)).sent == 0
    [delivery] = WebhookDelivery.objects.all()
    assert (delivery.status, delivery.attempts, delivery.last_status_code) == ("delivered", 3, 200)
    assert delivery.delivered_at is not None
    assert len(receiver.requests) == 3
    successful = receiver.requests[-1]
    assert successful.headers["Baton-Event"] == "turn.completed"
    assert successful.headers["Baton-Delivery"] == delivery.event_id
    assert verify(endpoint.secret, successful.headers, successful.body)
    assert not verify("whsec_wrong", successful.headers, successful.body)
    body = json.loads(successful.body)
    assert body["type"] == "turn.completed"
    assert body["task_id"] == task.pk
    assert "Done." not in successful.body.decode()
    # Every attempt carries the same event id: a receiver deduplicates by it.
    assert {request.headers["Baton-Delivery"] for request in receiver.requests} == {
        delivery.event_id
    }


@pytest.mark.django_db
def test_a_receiver_that_is_down_gets_retries_with_backoff_then_failed(
    user, closed_port_url, settings
):
    settings.BATON_WEBHOOK_MAX_ATTEMPTS = 4
    settings.BATON_WEBHOOK_BACKOFF_SECONDS = 2
    settings.BATON_WEBHOOK_BACKOFF_MAX_SECONDS = 5
    create_endpoint(owner=user, url=closed_port_url)
    answered_task(owner=user)
    now = timezone.now()
    waits = []
    with http_client() as client:
        for attempt in range(1, 5):
            summary = deliver_due(client=client, now=now)
            assert summary.sent == 1
            delivery = WebhookDelivery.objects.get()
            assert delivery.attempts == attempt
            assert delivery.last_error == "ConnectError"
            assert delivery.last_status_code is None
            if attempt < 4:
                waits.append((delivery.next_attempt_at - now).total_seconds())
                now = delivery.next_attempt_at
    assert waits == [2, 4, 5]
    assert [backoff_seconds(attempt=n) for n in (1, 2, 3, 4)] == [2, 4, 5, 5]
    assert (delivery.status, delivery.attempts) == ("failed", 4)
    with http_client() as client:
        assert deliver_due(client=client, now=now + timedelta(days=1)).sent == 0


@pytest.mark.django_db
def test_a_non_2xx_answer_is_a_failed_attempt(user, receiver):
    receiver.script = [302]
    create_endpoint(owner=user, url=receiver.url)
    answered_task(owner=user)
    with http_client() as client:
        assert deliver_due(client=client).retrying == 1
    delivery = WebhookDelivery.objects.get()
    assert (delivery.status, delivery.last_status_code, delivery.last_error) == (
        "pending",
        302,
        "HTTP 302",
    )


@pytest.mark.django_db
def test_an_inactive_endpoint_gets_nothing(user, receiver):
    endpoint = create_endpoint(owner=user, url=receiver.url)
    answered_task(owner=user)
    endpoint.active = False
    endpoint.save()
    with http_client() as client:
        assert deliver_due(client=client).sent == 0
    assert receiver.requests == []


@pytest.mark.django_db
def test_the_command_makes_one_pass(user, receiver):
    create_endpoint(owner=user, url=receiver.url)
    answered_task(owner=user)
    call_command("deliver_webhooks", "--once")
    assert WebhookDelivery.objects.get().status == "delivered"
    assert len(receiver.requests) == 1


@pytest.mark.postgres_only
@pytest.mark.django_db(transaction=True)
def test_two_senders_at_once_never_send_one_delivery_twice(user, receiver, shipped_bots):
    create_endpoint(owner=user, url=receiver.url)
    for _ in range(30):
        answered_task(owner=user)
    assert WebhookDelivery.objects.count() == 30
    start = threading.Barrier(2)
    errors: list[BaseException] = []

    def sender() -> None:
        try:
            start.wait()
            with http_client() as client:
                while deliver_due(client=client, limit=3).sent:
                    pass
        except BaseException as error:  # noqa: BLE001 (reported to the test below)
            errors.append(error)
        finally:
            connection.close()

    threads = [threading.Thread(target=sender) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    sent = [request.headers["Baton-Delivery"] for request in receiver.requests]
    assert len(sent) == len(set(sent)) == 30
    assert set(WebhookDelivery.objects.values_list("status", "attempts")) == {("delivered", 1)}
