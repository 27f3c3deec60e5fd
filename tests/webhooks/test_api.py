"""The webhook API: who may register, list, delete and read deliveries, and bad input."""

from __future__ import annotations

import pytest

from backend.tasks.factories import answered_task
from backend.webhooks.models import WebhookDelivery, WebhookEndpoint

pytestmark = pytest.mark.django_db

URL = "https://product.example/hooks"


def register(client, **body):
    return client.post("/api/webhooks/", {"url": URL, **body}, format="json")


def test_register_shows_the_secret_once(api, user):
    response = register(api)
    assert response.status_code == 201, response.json()
    created = response.json()
    assert created["secret"].startswith("whsec_") and len(created["secret"]) > 40
    assert created["events"] == ["turn.completed", "turn.failed", "turn.cancelled"]
    assert created["task"] is None
    listed = api.get("/api/webhooks/").json()
    assert [item["id"] for item in listed["results"]] == [created["id"]]
    assert "secret" not in listed["results"][0]
    assert WebhookEndpoint.objects.get().owner == user


def test_register_for_one_task_and_some_events(api, user):
    task = answered_task(owner=user)
    response = register(api, task=task.pk, events=["turn.failed"])
    assert response.status_code == 201, response.json()
    assert (response.json()["task"], response.json()["events"]) == (task.pk, ["turn.failed"])


def test_another_users_task_is_404(api, other_user, staff_api):
    task = answered_task(owner=other_user)
    assert register(api, task=task.pk).status_code == 404
    # Staff may read every task, but an endpoint hears only its owner's tasks.
    assert register(staff_api, task=task.pk).status_code == 404
    assert not WebhookEndpoint.objects.exists()


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"url": "ftp://product.example/x"}, "url"),
        ({"url": "not a url"}, "url"),
        ({"url": "https://product.example/" + "a" * 2000}, "url"),
        ({"url": 5}, "url"),
        ({"url": URL, "events": ["turn.started"]}, "events.0"),
        ({"url": URL, "events": []}, "events"),
        ({"url": URL, "events": ["turn.failed", "turn.failed"]}, "events"),
        ({"url": URL, "task": "7"}, "task"),
        ({"url": URL, "secret": "mine"}, "secret"),
        ({}, "url"),
    ],
)
def test_bad_input_is_400_naming_the_field(api, body, field):
    response = api.post("/api/webhooks/", body, format="json")
    assert response.status_code == 400, response.json()
    assert field in response.json()["fields"], response.json()


def test_deleting_and_reading_are_for_the_owner_only(api, other_api, user):
    endpoint_id = register(api).json()["id"]
    answered_task(owner=user)
    assert other_api.get(f"/api/webhooks/{endpoint_id}/deliveries/").status_code == 404
    assert other_api.delete(f"/api/webhooks/{endpoint_id}/").status_code == 404
    assert other_api.get("/api/webhooks/").json()["results"] == []
    deliveries = api.get(f"/api/webhooks/{endpoint_id}/deliveries/").json()["results"]
    assert [(item["event_type"], item["status"], item["attempts"]) for item in deliveries] == [
        ("turn.completed", "pending", 0)
    ]
    assert "payload" not in deliveries[0]
    assert api.delete(f"/api/webhooks/{endpoint_id}/").status_code == 204
    assert not WebhookEndpoint.objects.exists()
    assert not WebhookDelivery.objects.exists()


def test_authentication_and_worker_accounts(client, worker_api):
    assert client.get("/api/webhooks/").status_code in (401, 403)
    assert worker_api.get("/api/webhooks/").status_code == 403
    assert worker_api.post("/api/webhooks/", {"url": URL}, format="json").status_code == 403


def test_the_schema_names_the_webhook_operations(api):
    schema = api.get("/api/schema/", {"format": "json"}).json()
    operations = {
        operation["operationId"]
        for path in schema["paths"].values()
        for operation in path.values()
        if isinstance(operation, dict) and "operationId" in operation
    }
    assert {
        "webhooks_list",
        "webhooks_create",
        "webhooks_delete",
        "webhooks_deliveries_list",
    } <= operations
