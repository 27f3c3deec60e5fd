"""Django admin for webhook endpoints and their deliveries.

Endpoints are registered through the API (which shows the secret once); the admin can switch
one off or remove it, and shows only the start of its secret. Deliveries are written by the
services and the sender only: read-only here, searchable by task.
"""

from __future__ import annotations

from django.contrib import admin
from django.http import HttpRequest

from backend.admin_mixins import ReadOnlyAdminMixin
from backend.webhooks.models import WebhookDelivery, WebhookEndpoint

SECRET_SHOWN_CHARS = 10


@admin.register(WebhookEndpoint)
class WebhookEndpointAdmin(admin.ModelAdmin[WebhookEndpoint]):
    list_display = ("id", "owner", "task", "url", "events", "active", "created_at")
    list_filter = ("active",)
    list_select_related = ("owner",)
    search_fields = ("=task__id", "owner__username", "url")
    fields = ("owner", "task", "url", "events", "active", "secret_start", "created_at")
    readonly_fields = ("owner", "task", "url", "events", "secret_start", "created_at")

    @admin.display(description="secret")
    def secret_start(self, endpoint: WebhookEndpoint) -> str:
        return endpoint.secret[:SECRET_SHOWN_CHARS] + "…"

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False


@admin.register(WebhookDelivery)
class WebhookDeliveryAdmin(ReadOnlyAdminMixin, admin.ModelAdmin[WebhookDelivery]):
    allow_delete = True
    list_display = (
        "id",
        "event_type",
        "task",
        "subtask_id",
        "endpoint",
        "status",
        "attempts",
        "last_status_code",
        "last_error",
        "next_attempt_at",
        "delivered_at",
        "created_at",
    )
    list_filter = ("status", "event_type")
    search_fields = ("=task__id", "=event_id")
    raw_id_fields = ("endpoint", "task", "subtask")
    fields = (
        "event_id",
        "event_type",
        "endpoint",
        "task",
        "subtask",
        "status",
        "attempts",
        "last_status_code",
        "last_error",
        "next_attempt_at",
        "delivered_at",
        "created_at",
        "payload",
    )
    readonly_fields = fields
