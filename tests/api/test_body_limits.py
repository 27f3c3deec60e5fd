"""Each endpoint's request body limit, through the whole Django stack (middleware, DRF views).

A body is refused from its Content-Length before a byte of it is read: these tests give the
server a body stream that fails when read. Without Content-Length (chunked), the body is read
up to the limit and one byte more. The limits are computed from the settings at each request,
so the tests set small message and result limits.
"""

from __future__ import annotations

import io
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest
from rest_framework.test import APIClient

from backend.api import body_limits
from backend.tasks.factories import answer_pending
from backend.tasks.models import Subtask, Task
from tests.conftest import register_bot

pytestmark = pytest.mark.django_db

MESSAGE_LIMIT = 1_000
RESULT_LIMIT = 2_000
SINGLE = {"title": "Fix", "task_type": "code", "message": "CI is red.", "executor": "codex"}
# A character outside the Basic Multilingual Plane: one char, two \uXXXX escapes in JSON.
ASTRAL = "\U0001f600"


@pytest.fixture(autouse=True)
def small_limits(settings):
    settings.BATON_MAX_MESSAGE_BYTES = MESSAGE_LIMIT
    settings.BATON_MAX_RESULT_BYTES = RESULT_LIMIT


class UnreadBody:
    """A request body stream that fails the test if anything reads it."""

    def read(self, *args: Any) -> bytes:
        raise AssertionError("the request body was read")

    readline = read


def escaped_json(value: Any) -> str:
    """`value` as JSON with every character of every string, keys included, written as a
    \\uXXXX escape: the largest JSON a value can be, whitespace aside."""
    if isinstance(value, str):
        units = value.encode("utf-16-be")
        return '"' + "".join(f"\\u{units[i : i + 2].hex()}" for i in range(0, len(units), 2)) + '"'
    if isinstance(value, dict):
        items = (f"{escaped_json(key)}:{escaped_json(item)}" for key, item in value.items())
        return "{" + ",".join(items) + "}"
    if isinstance(value, list):
        return "[" + ",".join(escaped_json(item) for item in value) + "]"
    return json.dumps(value)


def post_raw(client: APIClient, path: str, body: bytes | None = None, **environ: Any) -> Any:
    """POST `body` as JSON; `environ` overrides what the server sees (CONTENT_LENGTH,
    wsgi.input, ...)."""
    if body is not None:
        environ = {"CONTENT_LENGTH": str(len(body)), "wsgi.input": io.BytesIO(body), **environ}
    return client.generic("POST", path, content_type="application/json", **environ)


def padded(document: dict[str, Any], size: int) -> bytes:
    """`document` as JSON followed by whitespace up to exactly `size` bytes."""
    body = json.dumps(document).encode()
    assert len(body) <= size
    return body + b" " * (size - len(body))


def create_task(api: APIClient, **fields: Any) -> dict[str, Any]:
    response = api.post("/api/tasks/", {**SINGLE, **fields}, format="json")
    assert response.status_code == 201, response.json()
    return response.json()


def claimed_turn(api: APIClient, worker_api: APIClient) -> dict[str, Any]:
    create_task(api)
    response = worker_api.post(
        "/api/executor/dispatch/", {"kinds": ["codex"], "worker_id": "w1"}, format="json"
    )
    [turn] = response.json()["turns"]
    return turn


# --- the limits --------------------------------------------------------------------------------


def test_the_limits_at_the_shipped_settings(settings):
    settings.BATON_MAX_MESSAGE_BYTES = 1_048_576
    settings.BATON_MAX_RESULT_BYTES = 67_108_864
    assert settings.BATON_MAX_PIPELINE_STEPS == 16
    assert body_limits.NEW_TASK.size() == 6 * 1_048_576 + 65_536 + 16 * 2_048 == 6_389_760
    assert body_limits.FOLLOW_UP.size() == 6 * 1_048_576 + 65_536 == 6_356_992
    assert body_limits.PROGRESS.size() == 6 * 1_048_576 + 16_384_000 + 65_536
    assert body_limits.RESULT.size() == 6 * 67_108_864 + 1_048_576
    assert body_limits.DEFAULT.size() == 1_048_576


def test_the_largest_valid_new_task_fits_its_limit(api, settings):
    """Every string at its longest and escaped char by char, the longest pipeline."""
    bot = register_bot(ASTRAL * 64, "claude_code").name
    steps = settings.BATON_MAX_PIPELINE_STEPS
    document = {
        "title": ASTRAL * 200,
        "task_type": "a" * 64,
        "message": "A" * MESSAGE_LIMIT,
        "sender": ASTRAL * 64,
        "is_group_chat": False,
        "pipeline": [
            {"bot": bot, "executor": "claude_code", "context_passing": "original_and_previous"}
        ]
        * steps,
    }
    body = escaped_json(document).encode()
    assert len(body) <= body_limits.NEW_TASK.size()
    response = post_raw(api, "/api/tasks/", body)
    assert response.status_code == 201, response.json()
    assert Task.objects.get().title == ASTRAL * 200


def test_the_largest_valid_follow_up_fits_its_limit(api):
    task = create_task(api)
    answer_pending(task=Task.objects.get(pk=task["id"]), answer="done")
    body = escaped_json({"message": "A" * MESSAGE_LIMIT, "sender": ASTRAL * 64}).encode()
    assert len(body) <= body_limits.FOLLOW_UP.size()
    response = post_raw(api, f"/api/tasks/{task['id']}/messages/", body)
    assert response.status_code == 201, response.json()


def test_the_largest_valid_result_fits_its_limit(api, worker_api):
    turn = claimed_turn(api, worker_api)
    document = {
        "worker_id": "w1",
        "attempt": turn["attempt"],
        "status": "COMPLETED",
        "result": {"value": "A" * RESULT_LIMIT, "commands": [{"command": "make", "exit_code": 0}]},
        "usage": {"input_tokens": 10**9, "output_tokens": 10**9, "model": "m" * 200},
        "native_session_id": "s" * 200,
        "session_resumed": False,
    }
    body = escaped_json(document).encode()
    assert len(body) <= body_limits.RESULT.size()
    response = post_raw(worker_api, f"/api/executor/subtasks/{turn['subtask_id']}/result/", body)
    assert response.status_code == 200, response.json()
    assert Subtask.objects.get(pk=turn["subtask_id"]).status == "COMPLETED"


def test_the_largest_progress_a_worker_posts_fits_its_limit(api, worker_api):
    """partial_text at the message limit, escaped; 1,000 events whose text the worker cut to
    4,000 chars (here of 4 bytes each), written as the worker's HTTP client writes JSON."""
    turn = claimed_turn(api, worker_api)
    command = ASTRAL * 2000 + "…2000 chars truncated…" + ASTRAL * 2000
    events = [
        {"type": "tool_started", "call_id": f"call_{n}", "tool": "shell", "command": command}
        for n in range(1000)
    ]
    head = json.dumps({"worker_id": "w1", "attempt": turn["attempt"]}, ensure_ascii=False)
    events_json = json.dumps(events, ensure_ascii=False, separators=(",", ":"))
    partial_text = escaped_json("A" * MESSAGE_LIMIT)
    body = f'{head[:-1]},"events":{events_json},"partial_text":{partial_text}}}'.encode()
    assert len(body) <= body_limits.PROGRESS.size()
    response = post_raw(worker_api, f"/api/executor/subtasks/{turn['subtask_id']}/progress/", body)
    assert response.status_code == 200, response.json()


# --- each endpoint over and at its limit ---------------------------------------------------------


@dataclass(frozen=True)
class Endpoint:
    """An endpoint, the limit it declares, and how to send it a valid request."""

    name: str
    limit: body_limits.BodyLimit
    client: str  # the fixture of the account that calls it
    # (api, worker_api) -> (path, a valid body, its success status)
    prepare: Callable[[APIClient, APIClient], tuple[str, dict[str, Any], int]]


def _new_task(api: APIClient, worker_api: APIClient) -> tuple[str, dict[str, Any], int]:
    return "/api/tasks/", SINGLE, 201


def _follow_up(api: APIClient, worker_api: APIClient) -> tuple[str, dict[str, Any], int]:
    task = create_task(api)
    answer_pending(task=Task.objects.get(pk=task["id"]), answer="done")
    return f"/api/tasks/{task['id']}/messages/", {"message": "And now?"}, 201


def _progress(api: APIClient, worker_api: APIClient) -> tuple[str, dict[str, Any], int]:
    turn = claimed_turn(api, worker_api)
    body = {"worker_id": "w1", "attempt": 1, "partial_text": "Working"}
    return f"/api/executor/subtasks/{turn['subtask_id']}/progress/", body, 200


def _result(api: APIClient, worker_api: APIClient) -> tuple[str, dict[str, Any], int]:
    turn = claimed_turn(api, worker_api)
    body = {"worker_id": "w1", "attempt": 1, "status": "COMPLETED", "result": {"value": "ok"}}
    return f"/api/executor/subtasks/{turn['subtask_id']}/result/", body, 200


def _dispatch(api: APIClient, worker_api: APIClient) -> tuple[str, dict[str, Any], int]:
    return "/api/executor/dispatch/", {"kinds": ["codex"], "worker_id": "w1"}, 200


def _heartbeat(api: APIClient, worker_api: APIClient) -> tuple[str, dict[str, Any], int]:
    turn = claimed_turn(api, worker_api)
    body = {"worker_id": "w1", "turns": [{"subtask_id": turn["subtask_id"], "attempt": 1}]}
    return "/api/executor/heartbeat/", body, 200


def _cancel(api: APIClient, worker_api: APIClient) -> tuple[str, dict[str, Any], int]:
    task = create_task(api)
    return f"/api/tasks/{task['id']}/cancel/", {}, 200


def _policy(api: APIClient, worker_api: APIClient) -> tuple[str, dict[str, Any], int]:
    return "/api/policies/code/", {"max_messages": 30}, 200


ENDPOINTS = [
    Endpoint("new task", body_limits.NEW_TASK, "api", _new_task),
    Endpoint("follow-up", body_limits.FOLLOW_UP, "api", _follow_up),
    Endpoint("progress", body_limits.PROGRESS, "worker_api", _progress),
    Endpoint("result", body_limits.RESULT, "worker_api", _result),
    Endpoint("dispatch", body_limits.DEFAULT, "worker_api", _dispatch),
    Endpoint("heartbeat", body_limits.HEARTBEAT, "worker_api", _heartbeat),
    Endpoint("task cancel", body_limits.DEFAULT, "api", _cancel),
    Endpoint("policy change", body_limits.DEFAULT, "staff_api", _policy),
]


def _send(endpoint: Endpoint, client: APIClient, path: str, **environ: Any) -> Any:
    if endpoint.name == "policy change":
        return client.generic("PATCH", path, content_type="application/json", **environ)
    return post_raw(client, path, **environ)


@pytest.mark.parametrize("endpoint", ENDPOINTS, ids=lambda endpoint: endpoint.name)
def test_a_body_over_the_limit_is_413_naming_it_unread(endpoint, request, api, worker_api):
    path, _, _ = endpoint.prepare(api, worker_api)
    limit = endpoint.limit.size()
    client = request.getfixturevalue(endpoint.client)
    response = _send(
        endpoint, client, path, CONTENT_LENGTH=str(limit + 1), **{"wsgi.input": UnreadBody()}
    )
    assert response.status_code == 413
    body = response.json()
    assert body["code"] == "too_large"
    assert f"The request body is {limit + 1} bytes; " in body["detail"]
    assert f" accepts at most {limit} bytes" in body["detail"]
    if endpoint.limit.field is None:
        assert "fields" not in body
    else:
        assert body["fields"] == {endpoint.limit.field: [body["detail"]]}
        assert endpoint.limit.setting in body["detail"]


@pytest.mark.parametrize("endpoint", ENDPOINTS, ids=lambda endpoint: endpoint.name)
def test_a_valid_body_of_exactly_the_limit_is_served(endpoint, request, api, worker_api):
    path, document, success = endpoint.prepare(api, worker_api)
    body = padded(document, endpoint.limit.size())
    client = request.getfixturevalue(endpoint.client)
    response = _send(
        endpoint, client, path, CONTENT_LENGTH=str(len(body)), **{"wsgi.input": io.BytesIO(body)}
    )
    assert response.status_code == success, response.json()


def test_the_413_names_the_endpoint_the_limit_and_the_field(api):
    limit = body_limits.NEW_TASK.size()
    response = post_raw(
        api, "/api/tasks/", CONTENT_LENGTH=str(100 * 2**20), **{"wsgi.input": UnreadBody()}
    )
    assert response.status_code == 413
    detail = (
        f"The request body is 104857600 bytes; POST /api/tasks/ accepts at most {limit} bytes "
        "(message: at most 1000 bytes of UTF-8, BATON_MAX_MESSAGE_BYTES)."
    )
    assert response.json() == {
        "detail": detail,
        "code": "too_large",
        "fields": {"message": [detail]},
    }
    assert Task.objects.count() == 0


# --- before authentication -----------------------------------------------------------------------


def test_the_size_is_checked_before_authentication():
    anonymous = APIClient()
    limit = body_limits.NEW_TASK.size()
    response = post_raw(
        anonymous, "/api/tasks/", CONTENT_LENGTH=str(limit + 1), **{"wsgi.input": UnreadBody()}
    )
    assert response.status_code == 413


def test_an_unauthenticated_body_within_the_limit_is_refused_unread():
    anonymous = APIClient()
    response = post_raw(
        anonymous, "/api/tasks/", CONTENT_LENGTH="1000", **{"wsgi.input": UnreadBody()}
    )
    assert response.status_code == 401


# --- without Content-Length ----------------------------------------------------------------------


def chunked(client: APIClient, path: str, stream: io.BytesIO, *, terminated: bool = True) -> Any:
    """A body without Content-Length, as a server that decodes chunked bodies hands it over."""
    environ: dict[str, Any] = {"HTTP_TRANSFER_ENCODING": "chunked", "wsgi.input": stream}
    if terminated:
        environ["wsgi.input_terminated"] = True
    return client.generic("POST", path, content_type="application/json", **environ)


def test_a_chunked_body_within_the_limit_is_read(api):
    stream = io.BytesIO(json.dumps({**SINGLE, "message": "sent in chunks"}).encode())
    response = chunked(api, "/api/tasks/", stream)
    assert response.status_code == 201, response.json()
    assert Subtask.objects.filter(role="USER").get().message == "sent in chunks"


def test_a_chunked_body_over_the_limit_is_413_after_one_byte_more(api):
    limit = body_limits.NEW_TASK.size()
    stream = io.BytesIO(padded(SINGLE, limit + 100_000))
    response = chunked(api, "/api/tasks/", stream)
    assert response.status_code == 413
    body = response.json()
    assert body["code"] == "too_large"
    assert body["detail"] == (
        f"The request body is larger than the {limit} bytes POST /api/tasks/ accepts "
        "(message: at most 1000 bytes of UTF-8, BATON_MAX_MESSAGE_BYTES)."
    )
    assert stream.tell() == limit + 1
    assert Task.objects.count() == 0


def test_a_chunked_body_the_server_cannot_measure_is_411(api):
    stream = io.BytesIO(json.dumps(SINGLE).encode())
    response = chunked(api, "/api/tasks/", stream, terminated=False)
    assert response.status_code == 411
    assert response.json()["code"] == "length_required"
    assert stream.tell() == 0


# --- outside the API -----------------------------------------------------------------------------


def test_the_admin_has_the_default_limit(client):
    limit = body_limits.DEFAULT.size()
    response = client.generic(
        "POST",
        "/admin/login/",
        content_type="application/x-www-form-urlencoded",
        CONTENT_LENGTH=str(limit + 1),
        **{"wsgi.input": UnreadBody()},
    )
    assert response.status_code == 413
    assert response["Content-Type"] == "text/plain; charset=utf-8"
    assert f"accepts at most {limit} bytes" in response.content.decode()
