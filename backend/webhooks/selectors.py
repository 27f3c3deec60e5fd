"""Reading webhook endpoints and their deliveries: an account's own, and every account's for
an operator with the endpoints' view permission (`backend.model_permissions`)."""

from __future__ import annotations

from django.contrib.auth.models import User
from django.db.models import QuerySet

from backend.errors import NotFound
from backend.model_permissions import VIEW, operator_may
from backend.webhooks.models import WebhookDelivery, WebhookEndpoint


def visible_endpoints(*, user: User) -> QuerySet[WebhookEndpoint]:
    """The user's endpoints; every account's for an operator who may view endpoints. What
    they may do with another account's is the API's permission classes' question."""
    endpoints = WebhookEndpoint.objects.all()
    if not operator_may(user, VIEW, WebhookEndpoint):
        endpoints = endpoints.filter(owner=user)
    return endpoints


def endpoint_list(*, user: User) -> QuerySet[WebhookEndpoint]:
    return visible_endpoints(user=user).order_by("-created_at", "-id")


def get_endpoint(*, user: User, endpoint_id: int) -> WebhookEndpoint:
    """The endpoint, or NotFound when the user may not see it (another account's endpoints do
    not exist for an ordinary account)."""
    endpoint = visible_endpoints(user=user).filter(pk=endpoint_id).first()
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
