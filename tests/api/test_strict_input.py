"""JSON bodies are taken at their type: no silent coercion, and nothing a report says dropped."""

from __future__ import annotations

import pytest

from backend.tasks.models import Subtask, Task
from tests.dispatch.test_dispatch_api import SINGLE, create, dispatch, report

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("pipeline_bots")]


@pytest.mark.parametrize(
    ("changes", "field", "problem"),
    [
        ({"message": 5}, "message", "Must be a string."),
        ({"title": ["a"]}, "title", "Must be a string."),
        ({"is_group_chat": "yes"}, "is_group_chat", "Must be true or false."),
        ({"is_group_chat": 1}, "is_group_chat", "Must be true or false."),
        ({"executor": 3}, "executor", "Must be a string."),
    ],
)
def test_creating_a_task_refuses_values_of_the_wrong_type(api, changes, field, problem):
    response = api.post("/api/tasks/", {**SINGLE, **changes}, format="json")
    assert response.status_code == 400
    assert response.json()["fields"] == {field: [problem]}
    assert not Task.objects.exists()


def test_worker_endpoints_refuse_numbers_sent_as_strings(api, worker_api):
    create(api)
    response = worker_api.post(
        "/api/executor/dispatch/",
        {"kinds": ["codex"], "limit": "5", "worker_id": "w1"},
        format="json",
    )
    assert response.status_code == 400
    assert response.json()["fields"] == {"limit": ["Must be an integer."]}
    [turn] = dispatch(worker_api)
    response = report(worker_api, {**turn, "attempt": "1"}, result={"value": "ok"})
    assert response.status_code == 400
    assert response.json()["fields"] == {"attempt": ["Must be an integer."]}
    assert Subtask.objects.get(pk=turn["subtask_id"]).status == "RUNNING"


def test_a_staff_policy_edit_refuses_a_number_sent_as_a_string(staff_api):
    response = staff_api.patch("/api/policies/default/", {"max_messages": "5"}, format="json")
    assert response.status_code == 400
    assert response.json()["fields"] == {"max_messages": ["Must be an integer."]}


def test_a_repeated_report_with_another_session_id_is_refused_not_dropped(api, worker_api):
    create(api)
    [turn] = dispatch(worker_api)
    first = report(worker_api, turn, result={"value": "ok"}, native_session_id="sess-1")
    assert first.status_code == 200
    again = report(worker_api, turn, result={"value": "ok"}, native_session_id="sess-1")
    assert (again.status_code, again.json()["changed"]) == (200, False)
    other = report(worker_api, turn, result={"value": "ok"}, native_session_id="sess-2")
    assert other.status_code == 409
    assert Subtask.objects.get(pk=turn["subtask_id"]).native_session_id == "sess-1"
