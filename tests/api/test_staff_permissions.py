"""The staff flag alone opens no other account's data: the API asks the Django model
permissions the admin asks (`backend.model_permissions`), per action, and records what an
operator writes into another account's task as the operator's.

A table over who calls (staff without permissions, staff with the view permissions, staff
with the change permissions, a superuser, the task's owner, another ordinary account) and
what they do with the owner's task, its artifact and turn text, the history policies and the
webhooks."""

from __future__ import annotations

import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Permission

from backend.dispatch.models import HistoryPolicy
from backend.prompting import Role
from backend.tasks.factories import answered_task
from backend.tasks.models import Subtask, Task, TaskStatus
from backend.webhooks.models import WebhookDelivery, WebhookEndpoint
from backend.webhooks.services import create_endpoint
from tests.conftest import token_client

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("pipeline_bots")]

STAFF_NONE, STAFF_VIEW, STAFF_CHANGE = "staff-none", "staff-view", "staff-change"
SUPERUSER, OWNER, OTHER = "superuser", "owner", "other"
CALLERS = [STAFF_NONE, STAFF_VIEW, STAFF_CHANGE, SUPERUSER, OWNER, OTHER]

# The permissions each staff caller holds, as the admin grants them (app label, codename).
# "change" holds no view permission: the admin lets whoever may change a model's rows see them.
GRANTED = {
    STAFF_NONE: [],
    STAFF_VIEW: [
        ("tasks", "view_task"),
        ("artifacts", "view_artifact"),
        ("dispatch", "view_historypolicy"),
        ("webhooks", "view_webhookendpoint"),
        ("webhooks", "view_webhookdelivery"),
    ],
    STAFF_CHANGE: [
        ("tasks", "change_task"),
        ("artifacts", "change_artifact"),
        ("dispatch", "change_historypolicy"),
        ("webhooks", "change_webhookendpoint"),
        ("webhooks", "change_webhookdelivery"),
    ],
}

# Over the spill threshold: the first message's whole text lives in an artifact.
LONG_MESSAGE = "".join(f"line {n:05d} of the build log\n" for n in range(1_000))


def _account(caller: str):
    users = get_user_model().objects
    if caller == SUPERUSER:
        return users.create_superuser(username="root-operator", password="x")
    account = users.create_user(username=caller, password="x", is_staff=caller in GRANTED)
    for app_label, codename in GRANTED.get(caller, []):
        account.user_permissions.add(
            Permission.objects.get(content_type__app_label=app_label, codename=codename)
        )
    return account


@pytest.fixture
def owner(db):
    return get_user_model().objects.create_user(username="alice", password="x")


@pytest.fixture
def task(owner) -> Task:
    return answered_task(owner=owner, message=LONG_MESSAGE)


@pytest.fixture
def spilled(task) -> Subtask:
    turn = task.subtasks.get(role=Role.USER)
    assert turn.history_is_preview and turn.artifact_id is not None
    return turn


def _client(caller: str, owner):
    return token_client(owner if caller == OWNER else _account(caller))


def _expect(**by_caller: int) -> list[tuple[str, int]]:
    return [(caller, by_caller[caller.replace("-", "_")]) for caller in CALLERS]


READ = _expect(
    staff_none=404, staff_view=200, staff_change=200, superuser=200, owner=200, other=404
)


@pytest.mark.parametrize(("caller", "code"), READ)
def test_reading_the_task(caller, code, owner, task):
    api = _client(caller, owner)
    assert api.get(f"/api/tasks/{task.pk}/").status_code == code
    assert api.get(f"/api/tasks/{task.pk}/subtasks/").status_code == code
    listed = [row["id"] for row in api.get("/api/tasks/").json()["results"]]
    assert (task.pk in listed) == (code == 200)


@pytest.mark.parametrize(("caller", "code"), READ)
def test_reading_its_artifact_and_turn_text(caller, code, owner, task, spilled):
    api = _client(caller, owner)
    artifact = spilled.artifact_id
    assert api.get(f"/api/artifacts/{artifact}/").status_code == code
    assert api.get(f"/api/artifacts/{artifact}/content/").status_code == code
    text = api.get(f"/api/tasks/{task.pk}/subtasks/{spilled.pk}/text/")
    assert text.status_code == code
    if code == 200:
        assert b"".join(text.streaming_content).decode() == LONG_MESSAGE


@pytest.mark.parametrize(
    ("caller", "code"),
    _expect(staff_none=404, staff_view=403, staff_change=201, superuser=201, owner=201, other=404),
)
def test_posting_a_follow_up(caller, code, owner, task):
    api = _client(caller, owner)
    turns_before = task.subtasks.count()
    response = api.post(f"/api/tasks/{task.pk}/messages/", {"message": "And now?"}, format="json")
    assert response.status_code == code, response.json()
    if code != 201:
        assert task.subtasks.count() == turns_before
        if code == 403:
            assert "tasks.change_task" in response.json()["detail"]
        return
    [user_turn] = [turn for turn in response.json() if turn["role"] == Role.USER]
    # The owner's own carry the product's sender (none here); an operator's carry theirs.
    recorded = "" if caller == OWNER else _username(caller)
    assert user_turn["sender"] == recorded
    assert Subtask.objects.get(pk=user_turn["id"]).sender == recorded


def _username(caller: str) -> str:
    return "root-operator" if caller == SUPERUSER else caller


def test_an_operator_cannot_write_in_another_senders_name(owner, task):
    api = _client(STAFF_CHANGE, owner)
    turns_before = task.subtasks.count()
    response = api.post(
        f"/api/tasks/{task.pk}/messages/", {"message": "Hi", "sender": "alice"}, format="json"
    )
    assert response.status_code == 400
    assert response.json()["fields"]["sender"]
    assert task.subtasks.count() == turns_before


@pytest.mark.parametrize(
    ("caller", "code"),
    _expect(staff_none=404, staff_view=403, staff_change=200, superuser=200, owner=200, other=404),
)
def test_cancelling_the_task(caller, code, owner, task):
    api = _client(caller, owner)
    response = api.post(f"/api/tasks/{task.pk}/cancel/")
    assert response.status_code == code
    task.refresh_from_db()
    assert (task.status == TaskStatus.CANCELLED) == (code == 200)


POLICY_READ = _expect(
    staff_none=403, staff_view=200, staff_change=200, superuser=200, owner=403, other=403
)


@pytest.mark.parametrize(("caller", "code"), POLICY_READ)
def test_listing_the_policies(caller, code, owner):
    api = _client(caller, owner)
    assert api.get("/api/policies/").status_code == code
    assert api.get("/api/policies/code/").status_code == code


@pytest.mark.parametrize(
    ("caller", "code"),
    _expect(staff_none=403, staff_view=403, staff_change=200, superuser=200, owner=403, other=403),
)
def test_changing_a_policy(caller, code, owner):
    row = HistoryPolicy.objects.get(task_type="code")  # a shipped row
    HistoryPolicy.objects.filter(pk=row.pk).update(max_messages=7)
    api = _client(caller, owner)
    response = api.patch("/api/policies/code/", {"max_messages": 3}, format="json")
    assert response.status_code == code
    changed = HistoryPolicy.objects.select_related("updated_by").get(pk=row.pk)
    if code == 200:
        assert (changed.max_messages, changed.updated_by.username) == (3, _username(caller))
    else:
        assert (changed.max_messages, changed.version) == (7, row.version)  # unchanged
        assert "dispatch.change_historypolicy" in response.json()["detail"]


def test_creating_a_task_types_policy_needs_the_add_permission_too(owner):
    api = _client(STAFF_CHANGE, owner)
    response = api.patch("/api/policies/triage/", {"max_messages": 3}, format="json")
    assert response.status_code == 403
    assert "dispatch.add_historypolicy" in response.json()["detail"]
    assert not HistoryPolicy.objects.filter(task_type="triage").exists()


@pytest.mark.parametrize(
    ("caller", "sees"),
    _expect(staff_none=0, staff_view=1, staff_change=1, superuser=1, owner=1, other=0),
)
def test_listing_and_creating_webhooks(caller, sees, owner, task):
    endpoint = create_endpoint(owner=owner, url="https://hooks.example.com/alice")
    api = _client(caller, owner)
    listed = api.get("/api/webhooks/")
    assert listed.status_code == 200
    assert [row["id"] for row in listed.json()["results"]].count(endpoint.pk) == sees
    # Everyone registers endpoints of their own; one hears its owner's tasks only.
    created = api.post("/api/webhooks/", {"url": "https://hooks.example.com/mine"}, format="json")
    assert created.status_code == 201
    mine = WebhookEndpoint.objects.get(pk=created.json()["id"])
    assert mine.owner.username == (owner.username if caller == OWNER else _username(caller))
    on_task = api.post(
        "/api/webhooks/", {"url": "https://hooks.example.com/t", "task": task.pk}, format="json"
    )
    assert on_task.status_code == (201 if caller == OWNER else 404)


@pytest.mark.parametrize(
    ("caller", "deliveries", "delete"),
    [
        (STAFF_NONE, 404, 404),
        (STAFF_VIEW, 200, 403),
        (STAFF_CHANGE, 200, 403),
        (SUPERUSER, 200, 204),
        (OWNER, 200, 204),
        (OTHER, 404, 404),
    ],
)
def test_another_accounts_endpoint(caller, deliveries, delete, owner):
    endpoint = create_endpoint(owner=owner, url="https://hooks.example.com/alice")
    api = _client(caller, owner)
    assert api.get(f"/api/webhooks/{endpoint.pk}/deliveries/").status_code == deliveries
    response = api.delete(f"/api/webhooks/{endpoint.pk}/")
    assert response.status_code == delete
    assert WebhookEndpoint.objects.filter(pk=endpoint.pk).exists() == (delete != 204)
    if delete == 403:
        assert "webhooks.delete_webhookendpoint" in response.json()["detail"]
    assert not WebhookDelivery.objects.exists()


def test_a_worker_keeps_its_own_scope(owner, task, spilled, worker_api):
    """Executor accounts read only what their claimed turns need: nothing of an idle task."""
    assert worker_api.get(f"/api/tasks/{task.pk}/").status_code == 403
    assert worker_api.get(f"/api/artifacts/{spilled.artifact_id}/").status_code == 404
