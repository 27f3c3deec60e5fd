"""Every answer under /api/ is Baton's JSON error body, over real HTTP requests: bodies nested
too deeply, URLs no endpoint matches, a Host header the server does not serve and unhandled
exceptions; the admin keeps Django's HTML pages."""

from __future__ import annotations

import json
import logging

import pytest
from hypothesis import given
from hypothesis import strategies as st

from backend.api import views
from backend.api.parsers import MAX_JSON_DEPTH, nested_deeper_than
from backend.tasks.models import Subtask, Task
from backend.tasks.selectors import turn_result

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("pipeline_bots")]

SINGLE = {"title": "Fix", "task_type": "code", "message": "CI is red.", "executor": "codex"}
TOO_DEEP = {
    "detail": f"The request body is nested too deeply (more than {MAX_JSON_DEPTH} levels).",
    "code": "parse_error",
}


def lists(depth: int, inner: str = "") -> str:
    """JSON text of `depth` lists, one inside the other."""
    return "[" * depth + inner + "]" * depth


def task_body(depth: int) -> str:
    """A task body whose message nests lists so that the body is `depth` levels deep."""
    fields = json.dumps({k: v for k, v in SINGLE.items() if k != "message"})[1:-1]
    return "{" + fields + ', "message": ' + lists(depth - 1) + "}"


def result_body(turn: dict, value: str) -> str:
    """A worker's result report whose `result.value` is the JSON text `value` (the body is two
    levels deeper than `value`)."""
    claim = {"worker_id": "w1", "attempt": turn["attempt"], "status": "COMPLETED"}
    return json.dumps(claim)[:-1] + ', "result": {"value": ' + value + "}}"


def post_json(client, path: str, text: str):
    return client.post(path, text, content_type="application/json")


@pytest.fixture
def claimed_turn(api, worker_api) -> dict:
    assert api.post("/api/tasks/", SINGLE, format="json").status_code == 201
    response = worker_api.post(
        "/api/executor/dispatch/", {"kinds": ["codex"], "worker_id": "w1"}, format="json"
    )
    [turn] = response.json()["turns"]
    return turn


def result_path(turn: dict) -> str:
    return f"/api/executor/subtasks/{turn['subtask_id']}/result/"


# --- bodies nested too deeply ---------------------------------------------------------------


@pytest.mark.parametrize("depth", [MAX_JSON_DEPTH + 1, 950, 100_000])
def test_a_task_body_nested_too_deeply_is_400_parse_error(api, depth):
    response = post_json(api, "/api/tasks/", task_body(depth))
    assert response.status_code == 400
    assert response.json() == TOO_DEEP
    assert Task.objects.count() == 0


@pytest.mark.parametrize("depth", [MAX_JSON_DEPTH + 1, 950, 100_000])
def test_a_bare_list_nested_too_deeply_is_400_parse_error(api, depth):
    response = post_json(api, "/api/tasks/", lists(depth))
    assert response.status_code == 400
    assert response.json() == TOO_DEEP


def test_a_body_nested_to_the_limit_gets_the_ordinary_answer(api):
    response = post_json(api, "/api/tasks/", task_body(MAX_JSON_DEPTH))
    assert response.status_code == 400
    assert response.json()["code"] == "invalid"
    assert response.json()["fields"] == {"message": ["Must be a string."]}


def test_brackets_inside_strings_are_text_not_nesting(api):
    message = "[" * 5000 + '{"\\' * 5000 + "]" * 5000
    response = api.post("/api/tasks/", {**SINGLE, "message": message}, format="json")
    assert response.status_code == 201, response.json()
    [turn] = response.json()["turns"][:1]
    assert turn["spilled"] == "message"  # 25,000 chars: the turn shows its preview
    whole = api.get(turn["message"]["url"])
    assert b"".join(whole.streaming_content).decode() == message


@pytest.mark.parametrize("depth", [MAX_JSON_DEPTH - 1, 950, 100_000])
def test_a_result_nested_too_deeply_is_400_parse_error_and_changes_nothing(
    worker_api, claimed_turn, depth
):
    response = post_json(
        worker_api, result_path(claimed_turn), result_body(claimed_turn, lists(depth))
    )
    assert response.status_code == 400
    assert response.json() == TOO_DEEP
    stored = Subtask.objects.get(pk=claimed_turn["subtask_id"])
    assert (stored.status, stored.result) == ("RUNNING", None)


def test_a_result_nested_to_the_limit_is_stored_and_served(api, worker_api, claimed_turn):
    value = lists(MAX_JSON_DEPTH - 2, '"deep"')  # the body is MAX_JSON_DEPTH levels deep
    response = post_json(worker_api, result_path(claimed_turn), result_body(claimed_turn, value))
    assert response.status_code == 200, response.json()
    stored = Subtask.objects.get(pk=claimed_turn["subtask_id"])
    assert stored.result == {"value": json.loads(value)}
    [turn] = api.get(f"/api/tasks/{claimed_turn['task_id']}/subtasks/").json()["results"][1:]
    assert turn["result"] == {"value": json.loads(value)}


def test_a_large_shallow_result_full_of_brackets_is_accepted(worker_api, claimed_turn):
    code = 'def f(x):\n    return {"a": [x[0], {"b": "c\\\\"}]}\n' * 20_000  # ~1 MB
    commands = [{"command": f"pytest -k [{i}]", "exit_code": 0} for i in range(1000)]
    response = worker_api.post(
        result_path(claimed_turn),
        {
            "worker_id": "w1",
            "attempt": claimed_turn["attempt"],
            "status": "COMPLETED",
            "result": {"value": code, "commands": commands},
        },
        format="json",
    )
    assert response.status_code == 200, response.json()
    stored = Subtask.objects.get(pk=claimed_turn["subtask_id"])
    assert turn_result(subtask=stored) == {"value": code, "commands": commands}


@pytest.mark.parametrize(
    ("client", "method", "path"),
    [
        ("api", "post", "/api/tasks/{task_id}/messages/"),
        ("worker_api", "post", "/api/executor/dispatch/"),
        ("worker_api", "post", "/api/executor/heartbeat/"),
        ("worker_api", "post", "/api/executor/subtasks/{subtask_id}/heartbeat/"),
        ("worker_api", "post", "/api/executor/subtasks/{subtask_id}/progress/"),
        ("staff_api", "patch", "/api/policies/code/"),
    ],
)
def test_every_endpoint_that_reads_a_body_refuses_one_nested_too_deeply(
    request, claimed_turn, client, method, path
):
    caller = request.getfixturevalue(client)
    url = path.format(task_id=claimed_turn["task_id"], subtask_id=claimed_turn["subtask_id"])
    response = getattr(caller, method)(url, lists(2000), content_type="application/json")
    assert response.status_code == 400
    assert response.json() == TOO_DEEP


def reference_depth(value: object) -> int:
    if isinstance(value, dict):
        return 1 + max(map(reference_depth, value.values()), default=0)
    if isinstance(value, list):
        return 1 + max(map(reference_depth, value), default=0)
    return 0


JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=3),
    lambda children: (
        st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=2), children, max_size=3)
    ),
    max_leaves=30,
)


@given(value=JSON_VALUES, limit=st.integers(min_value=0, max_value=8))
def test_nested_deeper_than_measures_like_the_recursive_definition(value, limit):
    assert nested_deeper_than(value, limit) == (reference_depth(value) > limit)


def test_nested_deeper_than_does_not_recurse():
    value: list = []
    for _ in range(100_000):
        value = [value]
    assert nested_deeper_than(value, 99_999)
    assert not nested_deeper_than(value, 100_001)


# --- answers Django gives before or after a view ----------------------------------------------


@pytest.mark.parametrize("path", ["/api/does-not-exist/", "/api/tasks/1/nope/", "/api"])
def test_an_unmatched_api_url_is_404_json(api, path):
    response = api.get(path)
    assert response.status_code == 404
    assert response["Content-Type"] == "application/json"
    assert response.json() == {"detail": "No API endpoint matches this URL.", "code": "not_found"}


def test_an_unmatched_api_url_is_404_json_without_credentials_too(client):
    response = client.post("/api/does-not-exist/", "{}", content_type="application/json")
    assert response.status_code == 404
    assert response.json()["code"] == "not_found"


def test_a_host_not_served_is_400_json_on_the_api(api, settings):
    settings.ALLOWED_HOSTS = ["testserver"]
    response = api.get("/api/tasks/", HTTP_HOST="elsewhere.example")
    assert response.status_code == 400
    assert response["Content-Type"] == "application/json"
    assert response.json() == {
        "detail": "The request's Host header names a host this server does not serve.",
        "code": "bad_request",
    }


def test_a_host_not_served_is_still_an_html_page_outside_the_api(client, settings):
    settings.ALLOWED_HOSTS = ["testserver"]
    response = client.get("/admin/", HTTP_HOST="elsewhere.example")
    assert response.status_code == 400
    assert response["Content-Type"].startswith("text/html")


SECRET = "the launch code is 0000"


def test_an_unhandled_exception_is_500_json_with_no_text_of_it(api, monkeypatch, caplog):
    def fail(self, request):
        raise RuntimeError(SECRET)

    monkeypatch.setattr(views.TaskListCreateApi, "get", fail)
    api.raise_request_exception = False
    with caplog.at_level(logging.INFO):
        response = api.get("/api/tasks/")

    assert response.status_code == 500
    assert response["Content-Type"] == "application/json"
    assert response.json() == {
        "detail": "The server failed to handle this request. The failure has been logged.",
        "code": "server_error",
    }
    assert b"launch code" not in response.content
    # Logged once, as an event with the exception's type: no text of it, no traceback.
    assert "launch code" not in caplog.text
    assert not [record for record in caplog.records if record.exc_info]
    [event] = [
        json.loads(record.getMessage())
        for record in caplog.records
        if record.name == "baton.events" and record.levelno == logging.ERROR
    ]
    assert event == {
        "event": "request_failed",
        "status": 500,
        "method": "GET",
        "view": "task-list",
        "error_type": "RuntimeError",
    }


def test_the_favicon_browsers_ask_for_is_no_content_not_a_404(client, caplog):
    with caplog.at_level(logging.WARNING):
        assert client.get("/favicon.ico").status_code == 204
    assert not caplog.records


def test_the_admin_keeps_its_html_404(client, staff_user):
    client.force_login(staff_user)
    response = client.get("/admin/does-not-exist/")
    assert response.status_code == 404
    assert response["Content-Type"].startswith("text/html")
    assert client.get("/does-not-exist/")["Content-Type"].startswith("text/html")


def test_with_debug_the_api_still_answers_json_and_the_admin_keeps_its_pages(
    api, client, staff_user, monkeypatch, settings
):
    """`make run` serves with DEBUG, where Django would answer its HTML debug pages."""
    settings.DEBUG = True
    for path in ("/api/does-not-exist/", "/api/tasks/1/nope/", "/api"):
        response = api.get(path)
        assert (response.status_code, response["Content-Type"]) == (404, "application/json")
        assert response.json()["code"] == "not_found"

    def fail(self, request):
        raise RuntimeError(SECRET)

    monkeypatch.setattr(views.TaskListCreateApi, "get", fail)
    api.raise_request_exception = False
    response = api.get("/api/tasks/")
    assert (response.status_code, response["Content-Type"]) == (500, "application/json")
    assert response.json()["code"] == "server_error"
    assert b"launch code" not in response.content
    # A URL the API's views know still redirects to its slash, and the admin keeps its pages.
    assert api.get("/api/tasks").status_code == 301
    client.force_login(staff_user)
    response = client.get("/admin/does-not-exist/")
    assert response.status_code == 404
    assert response["Content-Type"].startswith("text/html")
