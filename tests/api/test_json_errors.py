"""Every answer under /api/ is Baton's JSON error body, over real HTTP requests: bodies nested
too deeply."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

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
    assert response.json()["fields"] == {"message": ["Not a valid string."]}


def test_brackets_inside_strings_are_text_not_nesting(api):
    message = "[" * 5000 + '{"\\' * 5000 + "]" * 5000
    response = api.post("/api/tasks/", {**SINGLE, "message": message}, format="json")
    assert response.status_code == 201, response.json()
    assert response.json()["turns"][0]["message"] == message


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
