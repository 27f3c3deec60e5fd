"""Reading webhook endpoints and their deliveries, always within one owner's."""

from __future__ import annotations

from django.contrib.auth.models import User
from django.db.models import QuerySet

from backend.errors import NotFound
from backend.webhooks.models import WebhookDelivery, WebhookEndpoint


def endpoint_list(*, owner: User) -> QuerySet[WebhookEndpoint]:
    return WebhookEndpoint.objects.filter(owner=owner).order_by("-created_at", "-id")


def get_endpoint(*, owner: User, endpoint_id: int) -> WebhookEndpoint:
    """The owner's endpoint, or NotFound (another account's endpoints do not exist for it)."""
    endpoint = WebhookEndpoint.objects.filter(pk=endpoint_id, owner=owner).first()
    if endpoint is None:
        raise NotFound(f"Webhook {endpoint_id} does not exist.")
    return endpoint


def endpoint_deliveries(*, endpoint: WebhookEndpoint) -> QuerySet[WebhookDelivery]:
    """The endpoint's deliveries, newest first, without their payloads."""
    return (
        WebhookDelivery.objects.filter(endpoint=endpoint)
        .defer("payload")
        .order_by("-created_at", "-id")
    )
