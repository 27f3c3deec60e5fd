"""The task API over real HTTP requests through Django's test client: success and error paths."""

from __future__ import annotations

import json
import os

import pytest
from rest_framework.test import APIClient

from backend.tasks.factories import answer_pending
from backend.tasks.models import Subtask, Task

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("pipeline_bots")]

SINGLE = {
    "title": "Fix the build",
    "task_type": "code",
    "message": "CI is red.",
    "executor": "codex",
}
PIPELINE = {
    "title": "Review flow",
    "task_type": "code",
    "message": "Add retries to the uploader.",
    "sender": "carol",
    "pipeline": [
        {"bot": "coder", "executor": "codex"},
        {"bot": "reviewer", "executor": "claude_code", "context_passing": "previous_bot"},
    ],
}


def create(api: APIClient, body: dict) -> dict:
    response = api.post("/api/tasks/", body, format="json")
    assert response.status_code == 201, response.json()
    return response.json()


def finish_pending(task_id: int) -> None:
    answer_pending(task=Task.objects.get(pk=task_id), answer="done")


def assert_nothing_stored() -> None:
    assert Task.objects.count() == 0
    assert Subtask.objects.count() == 0


# --- authentication -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("get", "/api/tasks/"),
        ("post", "/api/tasks/"),
        ("get", "/api/tasks/1/"),
        ("post", "/api/tasks/1/messages/"),
        ("get", "/api/tasks/1/subtasks/"),
        ("post", "/api/tasks/1/cancel/"),
    ],
)
def test_every_endpoint_needs_authentication(client, method, path):
    response = getattr(client, method)(path)
    assert response.status_code == 401
    assert response.json()["code"] == "not_authenticated"


def test_a_wrong_token_is_refused(db):
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION="Token not-a-real-token")
    assert client.get("/api/tasks/").status_code == 401


# --- create ---------------------------------------------------------------------------------


def test_create_single_agent_task(api):
    body = create(api, {**SINGLE, "bot": "builder"})
    assert body["title"] == "Fix the build"
    assert body["status"] == "PENDING"
    assert body["owner"] == "alice"
    assert body["pipeline"] == [{"bot": "builder", "executor": "codex", "context_passing": None}]
    assert [(t["message_id"], t["role"], t["status"], t["message"]) for t in body["turns"]] == [
        (1, "USER", "COMPLETED", "CI is red."),
        (2, "ASSISTANT", "PENDING", ""),
    ]
    assert body["turns"][1]["parent_message_id"] == 1
    assert body["turns"][1]["executor"] == "codex"


def test_a_task_naming_only_an_executor_gets_its_default_bot(api):
    body = create(api, SINGLE)
    assert body["turns"][1]["bot"] == "codex"
    assert body["pipeline"] == [{"bot": "codex", "executor": "codex", "context_passing": None}]
    body = create(api, {**SINGLE, "executor": "claude_code"})
    assert body["turns"][1]["bot"] == "claude-code"


def test_a_task_naming_only_a_bot_runs_on_its_executor(api):
    body = create(api, {k: v for k, v in SINGLE.items() if k != "executor"} | {"bot": "reviewer"})
    assert body["pipeline"] == [
        {"bot": "reviewer", "executor": "claude_code", "context_passing": None}
    ]
    assert body["turns"][1]["executor"] == "claude_code"


@pytest.mark.parametrize(
    ("body", "field", "fragment"),
    [
        ({**SINGLE, "bot": "ghost"}, "bot", "'ghost' is not registered"),
        ({**SINGLE, "bot": "reviewer"}, "executor", "runs on claude_code, not codex"),
        (
            {**PIPELINE, "pipeline": [{"bot": "coder"}, {"bot": "ghost"}]},
            "pipeline.1.bot",
            "not registered",
        ),
        (
            {**PIPELINE, "pipeline": [{"bot": "coder", "executor": "agno"}]},
            "pipeline.0.executor",
            "runs on codex, not agno",
        ),
        ({**PIPELINE, "pipeline": [{"context_passing": "none"}]}, "pipeline.0.executor", "Name"),
    ],
)
def test_unregistered_or_mismatched_bots_are_400_and_store_nothing(api, body, field, fragment):
    response = api.post("/api/tasks/", body, format="json")
    assert response.status_code == 400, response.json()
    assert fragment in " ".join(response.json()["fields"][field])
    assert not Task.objects.exists()


def test_an_executor_without_a_default_bot_is_400(api):
    from backend.tasks.models import Bot

    Bot.objects.filter(executor="agno").update(is_default=False)
    response = api.post("/api/tasks/", {**SINGLE, "executor": "agno"}, format="json")
    assert response.status_code == 400
    assert "has no default bot" in response.json()["fields"]["executor"][0]


def test_bots_are_listed_and_read(api, worker_api):
    listed = api.get("/api/bots/").json()["results"]
    names = [bot["name"] for bot in listed]
    assert names == sorted(names)
    assert {"codex", "claude-code", "agno", "coder", "reviewer"} <= set(names)
    codex = api.get("/api/bots/codex/").json()
    assert codex == {
        "name": "codex",
        "executor": "codex",
        "model": "gpt-5.5",
        "instructions": "",
        "permission_mode": "full_access",
        "max_turns": None,
        "timeout_seconds": 1800,
        "context_window": None,
        "is_default": True,
        "updated_at": codex["updated_at"],
    }
    assert api.get("/api/bots/ghost/").status_code == 404
    assert APIClient().get("/api/bots/").status_code == 401


def test_create_pipeline_task(api):
    body = create(api, PIPELINE)
    assert [(t["message_id"], t["bot"], t["pipeline_step"]) for t in body["turns"]] == [
        (1, "", None),
        (2, "coder", 0),
        (3, "reviewer", 1),
    ]
    assert body["turns"][0]["sender"] == "carol"
    assert body["pipeline"][1]["context_passing"] == "previous_bot"


def test_create_group_chat_task(api):
    body = create(api, {**SINGLE, "is_group_chat": True, "sender": "alice"})
    assert body["is_group_chat"] is True
    assert body["turns"][0]["sender"] == "alice"


@pytest.mark.parametrize(
    ("body", "field", "fragment"),
    [
        ({**SINGLE, "executor": "gpt-5"}, "executor", "not a valid choice"),
        ({**SINGLE, "message": ""}, "message", "may not be blank"),
        ({**SINGLE, "message": "   "}, "message", "must not be empty"),
        ({k: v for k, v in SINGLE.items() if k != "message"}, "message", "required"),
        ({**SINGLE, "task_type": "Code Review"}, "task_type", "lowercase letters"),
        ({**SINGLE, "task_type": "a" * 65}, "task_type", "no more than 64"),
        ({**SINGLE, "title": ""}, "title", "may not be blank"),
        ({k: v for k, v in SINGLE.items() if k != "executor"}, "executor", "Name a bot"),
        ({**PIPELINE, "executor": "codex"}, "executor", "not both"),
        ({**PIPELINE, "pipeline": []}, "pipeline", "may not be empty"),
        (
            {**PIPELINE, "pipeline": [{"bot": "x", "executor": "nope"}]},
            "pipeline.0.executor",
            "not a valid choice",
        ),
        (
            {**PIPELINE, "pipeline": [{"bot": "x", "executor": "agno", "context_passing": "all"}]},
            "pipeline.0.context_passing",
            "not a valid choice",
        ),
        ({**SINGLE, "exector": "codex"}, "exector", "Unknown field"),
        ({**SINGLE, "is_group_chat": True}, "sender", "required in a group-chat task"),
        ({**SINGLE, "sender": "al[ice]"}, "sender", "without square brackets"),
        ({**SINGLE, "sender": "a" * 65}, "sender", "no more than 64"),
        ({**SINGLE, "bot": "two\nlines"}, "bot", "printable"),
        (
            {**PIPELINE, "pipeline": [{"bot": "a]", "executor": "agno"}]},
            "pipeline.0.bot",
            "square brackets",
        ),
    ],
)
def test_create_rejects_bad_input_naming_the_field(api, body, field, fragment):
    response = api.post("/api/tasks/", body, format="json")
    assert response.status_code == 400, response.json()
    error = response.json()
    assert field in error["fields"], error
    assert fragment in " ".join(error["fields"][field])
    assert field in error["detail"] or fragment in error["detail"]
    assert_nothing_stored()


def test_create_rejects_a_lone_surrogate_in_the_message(api):
    body = json.dumps({**SINGLE, "message": "bad \ud800", "executor": "x\udfff"})
    response = api.post("/api/tasks/", body, content_type="application/json")
    assert response.status_code == 400
    fields = response.json()["fields"]
    assert "x\udfff" in fields["executor"][0]  # echoed back without a server error
    response = api.post(
        "/api/tasks/",
        json.dumps({**SINGLE, "message": "bad \ud800"}),
        content_type="application/json",
    )
    assert response.status_code == 400
    assert response.json()["fields"]["message"] == ["Surrogate characters are not allowed: U+D800."]
    assert_nothing_stored()


def test_create_rejects_a_message_over_the_hard_limit(api, settings):
    settings.BATON_MAX_MESSAGE_BYTES = 1024
    response = api.post("/api/tasks/", {**SINGLE, "message": "x" * 1025}, format="json")
    assert response.status_code == 413
    assert response.json()["fields"] == {
        "message": ["message is 1025 bytes of UTF-8; the limit is 1024 bytes."]
    }
    assert_nothing_stored()


def steps(count: int) -> list[dict]:
    return [{"bot": "coder", "executor": "codex"}] * count


def test_a_pipeline_over_the_limit_is_400_naming_it_and_stores_nothing(
    api, settings, artifact_storage_in_tmp
):
    """Refused before any step is read or any text stored: the message here would spill."""
    assert settings.BATON_MAX_PIPELINE_STEPS == 16
    message = "x" * (settings.BATON_SPILL_THRESHOLD_CHARS + 1)
    response = api.post(
        "/api/tasks/", {**PIPELINE, "message": message, "pipeline": steps(17)}, format="json"
    )
    assert response.status_code == 400, response.json()
    body = response.json()
    assert body["code"] == "invalid"
    assert body["fields"] == {"pipeline": ["pipeline has 17 steps; at most 16 are allowed."]}
    assert "pipeline has 17 steps; at most 16 are allowed." in body["detail"]
    assert_nothing_stored()
    assert [path for path in artifact_storage_in_tmp.rglob("*") if path.is_file()] == []


def test_a_long_pipeline_is_refused_by_its_length_alone(api):
    """33,000 steps (once a 500 after 25 s): the count is checked before any step is read."""
    response = api.post(
        "/api/tasks/", {**PIPELINE, "pipeline": ["not a step"] * 33_000}, format="json"
    )
    assert response.status_code == 400
    assert response.json()["fields"] == {
        "pipeline": ["pipeline has 33000 steps; at most 16 are allowed."]
    }
    assert_nothing_stored()


def test_a_pipeline_at_the_limit_is_created(api):
    body = create(api, {**PIPELINE, "pipeline": steps(16)})
    assert len(body["pipeline"]) == 16
    assert [turn["pipeline_step"] for turn in body["turns"]] == [None, *range(16)]


def test_the_setting_sets_the_pipeline_limit(api, settings):
    settings.BATON_MAX_PIPELINE_STEPS = 2
    response = api.post("/api/tasks/", {**PIPELINE, "pipeline": steps(3)}, format="json")
    assert response.status_code == 400
    assert response.json()["fields"] == {
        "pipeline": ["pipeline has 3 steps; at most 2 are allowed."]
    }
    assert_nothing_stored()
    assert len(create(api, {**PIPELINE, "pipeline": steps(2)})["turns"]) == 3

    settings.BATON_MAX_PIPELINE_STEPS = 20
    assert len(create(api, {**PIPELINE, "pipeline": steps(20)})["turns"]) == 21


def test_a_nested_value_that_is_not_an_object_names_its_field(api):
    """Only the body as a whole gets the "must be a JSON object" answer; a pipeline step that
    is not an object is an error about that step."""
    response = api.post("/api/tasks/", {**SINGLE, "pipeline": ["codex"]}, format="json")
    assert response.status_code == 400
    body = response.json()
    assert body["code"] == "invalid"
    assert list(body["fields"]) == ["pipeline.0"]
    assert_nothing_stored()


@pytest.mark.parametrize("payload", ["[1, 2]", '"just a string"', "42", "null"])
def test_create_rejects_json_that_is_not_an_object(api, payload):
    response = api.post("/api/tasks/", payload, content_type="application/json")
    assert response.status_code == 400
    assert response.json() == {
        "detail": "The request body must be a JSON object.",
        "code": "invalid",
    }
    assert_nothing_stored()


def test_create_rejects_malformed_json(api):
    response = api.post("/api/tasks/", '{"title": ', content_type="application/json")
    assert response.status_code == 400
    assert "JSON parse error" in response.json()["detail"]
    assert_nothing_stored()


def test_create_rejects_non_json_content(api):
    response = api.post("/api/tasks/", "title=x", content_type="application/x-www-form-urlencoded")
    assert response.status_code == 415
    assert_nothing_stored()


# --- read -----------------------------------------------------------------------------------


def test_retrieve_task_with_turns(api):
    task_id = create(api, PIPELINE)["id"]
    body = api.get(f"/api/tasks/{task_id}/").json()
    assert body["id"] == task_id
    assert [t["message_id"] for t in body["turns"]] == [1, 2, 3]


def test_other_users_tasks_are_invisible(api, other_api):
    task_id = create(api, SINGLE)["id"]
    assert other_api.get(f"/api/tasks/{task_id}/").status_code == 404
    assert other_api.get(f"/api/tasks/{task_id}/subtasks/").status_code == 404
    response = other_api.post(f"/api/tasks/{task_id}/messages/", {"message": "hi"}, format="json")
    assert response.status_code == 404
    assert other_api.post(f"/api/tasks/{task_id}/cancel/").status_code == 404
    assert other_api.get("/api/tasks/").json()["count"] == 0
    assert Task.objects.get(pk=task_id).status == "PENDING"


def test_staff_see_every_task(api, staff_api):
    task_id = create(api, SINGLE)["id"]
    assert staff_api.get(f"/api/tasks/{task_id}/").status_code == 200
    assert staff_api.get("/api/tasks/").json()["count"] == 1


def test_missing_task_is_404(api):
    response = api.get("/api/tasks/424242/")
    assert response.status_code == 404
    assert response.json() == {"detail": "Task 424242 does not exist.", "code": "not_found"}


def test_list_is_paginated_newest_first_and_filtered(api):
    ids = [create(api, {**SINGLE, "title": f"task {i}"})["id"] for i in range(3)]
    chat_id = create(api, {**SINGLE, "task_type": "chat"})["id"]
    finish_pending(ids[0])

    page = api.get("/api/tasks/", {"page_size": 2}).json()
    assert page["count"] == 4
    assert [t["id"] for t in page["results"]] == [chat_id, ids[2]]
    assert page["next"] is not None

    by_type = api.get("/api/tasks/", {"task_type": "chat"}).json()
    assert [t["id"] for t in by_type["results"]] == [chat_id]

    completed = api.get("/api/tasks/", {"status": "COMPLETED"}).json()
    assert [t["id"] for t in completed["results"]] == [ids[0]]


def test_the_browsable_api_format_links_work_on_every_list(api):
    """The browsable API links each page to `?format=json` and `?format=api`; both must answer."""
    task_id = create(api, SINGLE)["id"]
    for path in ("/api/tasks/", f"/api/tasks/{task_id}/", f"/api/tasks/{task_id}/subtasks/"):
        as_json = api.get(path, {"format": "json"})
        assert as_json.status_code == 200, (path, as_json.content[:200])
        assert as_json["Content-Type"] == "application/json"
        as_page = api.get(path, {"format": "api"})
        assert as_page.status_code == 200, path
        assert as_page["Content-Type"].startswith("text/html")
        assert f"{path}?format=json".encode() in as_page.content


@pytest.mark.parametrize(
    ("query", "field"),
    [
        ({"page": "0"}, "page"),
        ({"page": "abc"}, "page"),
        ({"page_size": "0"}, "page_size"),
        ({"page_size": "abc"}, "page_size"),
        ({"page_size": "100000"}, "page_size"),
        ({"pagesize": "5"}, "pagesize"),
    ],
)
def test_both_lists_answer_a_bad_page_query_the_same_way(api, query, field):
    """The task list and a task's turns share one rule: a bad page or page size is a 400
    naming it (never a 404, never silently ignored); a page past the end is a 404."""
    task_id = create(api, SINGLE)["id"]
    for path in ("/api/tasks/", f"/api/tasks/{task_id}/subtasks/"):
        response = api.get(path, query)
        assert response.status_code == 400, (path, query)
        assert list(response.json()["fields"]) == [field], path
        past_the_end = api.get(path, {"page": "9"})
        assert past_the_end.status_code == 404, path
        assert past_the_end.json()["code"] == "not_found"


@pytest.mark.parametrize("query", [{"page": str(2**64)}, {"after": str(2**64)}])
def test_a_turn_page_past_what_a_row_number_holds_is_a_400_naming_it(api, query):
    task_id = create(api, SINGLE)["id"]
    response = api.get(f"/api/tasks/{task_id}/subtasks/", query)
    assert response.status_code == 400
    assert list(response.json()["fields"]) == list(query)


def test_list_still_refuses_an_unknown_query_parameter(api):
    response = api.get("/api/tasks/", {"statu": "COMPLETED"})
    assert response.status_code == 400
    assert response.json()["fields"] == {"statu": ["Unknown field."]}


def test_list_rejects_an_unknown_status(api):
    response = api.get("/api/tasks/", {"status": "DONE"})
    assert response.status_code == 400
    assert "status" in response.json()["fields"]


@pytest.mark.parametrize("count", [2, 12])
def test_list_query_count_does_not_grow_with_tasks(api, django_assert_num_queries, count):
    for i in range(count):
        create(api, {**SINGLE, "title": f"t{i}"})
    # page count, page rows (the token's account is remembered from the requests before)
    with django_assert_num_queries(2):
        response = api.get("/api/tasks/")
    assert len(response.json()["results"]) == count


@pytest.mark.parametrize("rounds", [1, 6])
def test_subtasks_query_count_does_not_grow_with_turns(api, django_assert_num_queries, rounds):
    task_id = create(api, PIPELINE)["id"]
    for i in range(rounds - 1):
        finish_pending(task_id)
        api.post(f"/api/tasks/{task_id}/messages/", {"message": f"more {i}"}, format="json")
    # task, turn count, turn rows, their prompt report links (the token's account is
    # remembered from the requests before)
    with django_assert_num_queries(4):
        response = api.get(f"/api/tasks/{task_id}/subtasks/")
    body = response.json()
    assert body["count"] == 3 * rounds
    assert [t["message_id"] for t in body["results"]] == list(range(1, 3 * rounds + 1))


def test_retrieve_query_count(api, django_assert_num_queries):
    task_id = create(api, PIPELINE)["id"]
    # task with owner, turns, their prompt report links, queued messages (the token's account
    # is remembered from the requests before)
    with django_assert_num_queries(4):
        api.get(f"/api/tasks/{task_id}/")


# --- follow-ups -----------------------------------------------------------------------------


def test_follow_up_returns_the_new_turns(api):
    task_id = create(api, PIPELINE)["id"]
    finish_pending(task_id)
    response = api.post(
        f"/api/tasks/{task_id}/messages/",
        {"message": "Now the docs.", "sender": "dan"},
        format="json",
    )
    assert response.status_code == 201
    assert [(t["message_id"], t["role"], t["sender"]) for t in response.json()] == [
        (4, "USER", "dan"),
        (5, "ASSISTANT", ""),
        (6, "ASSISTANT", ""),
    ]


def test_follow_up_while_pending_is_409_and_stores_nothing(api):
    # The `reject` strategy; the others are test_follow_up_strategies'.
    task_id = create(api, SINGLE)["id"]
    response = api.post(
        f"/api/tasks/{task_id}/messages/", {"message": "hurry", "strategy": "reject"}, format="json"
    )
    assert response.status_code == 409
    assert "PENDING (message_id 2)" in response.json()["detail"]
    assert Subtask.objects.filter(task_id=task_id).count() == 2


@pytest.mark.parametrize(
    ("body", "status", "field"),
    [
        ({"message": ""}, 400, "message"),
        ({}, 400, "message"),
        ({"message": "hi", "colour": "red"}, 400, "colour"),
        ({"message": 12}, 400, "message"),  # a number is not text: no silent coercion
        ({"message": ["hi"]}, 400, "message"),
    ],
)
def test_follow_up_validation(api, body, status, field):
    task_id = create(api, SINGLE)["id"]
    finish_pending(task_id)
    response = api.post(f"/api/tasks/{task_id}/messages/", body, format="json")
    assert response.status_code == status
    if field:
        assert field in response.json()["fields"]
        assert Subtask.objects.filter(task_id=task_id).count() == 2


def test_follow_up_to_a_cancelled_task_is_409(api):
    task_id = create(api, SINGLE)["id"]
    assert api.post(f"/api/tasks/{task_id}/cancel/").status_code == 200
    response = api.post(f"/api/tasks/{task_id}/messages/", {"message": "hi"}, format="json")
    assert response.status_code == 409
    assert "cancelled" in response.json()["detail"]
    assert Subtask.objects.filter(task_id=task_id).count() == 2


def test_follow_up_to_a_missing_task_is_404(api):
    response = api.post("/api/tasks/999/messages/", {"message": "hi"}, format="json")
    assert response.status_code == 404
    assert_nothing_stored()


def test_follow_up_in_group_chat_needs_a_sender(api):
    task_id = create(api, {**SINGLE, "is_group_chat": True, "sender": "alice"})["id"]
    finish_pending(task_id)
    response = api.post(f"/api/tasks/{task_id}/messages/", {"message": "hi"}, format="json")
    assert response.status_code == 400
    assert "sender" in response.json()["fields"]


# --- cancel ---------------------------------------------------------------------------------


def test_cancel_marks_task_and_open_turns(api):
    task_id = create(api, PIPELINE)["id"]
    response = api.post(f"/api/tasks/{task_id}/cancel/")
    assert response.status_code == 200
    assert response.json()["status"] == "CANCELLED"
    statuses = dict(Subtask.objects.filter(task_id=task_id).values_list("message_id", "status"))
    assert statuses == {1: "COMPLETED", 2: "CANCELLED", 3: "CANCELLED"}
    assert api.post(f"/api/tasks/{task_id}/cancel/").json()["status"] == "CANCELLED"


# --- schema ---------------------------------------------------------------------------------


def test_openapi_schema_and_docs_are_served(client):
    schema = client.get("/api/schema/", HTTP_ACCEPT="application/vnd.oai.openapi+json")
    assert schema.status_code == 200
    document = json.loads(schema.content)
    assert "/api/tasks/{task_id}/messages/" in document["paths"]
    assert "TaskCreateInput" in document["components"]["schemas"]
    docs = client.get("/api/docs/")
    assert docs.status_code == 200
    assert b"swagger-ui" in docs.content


def test_openapi_schema_validates_without_warnings():
    from django.core.management import call_command

    call_command("spectacular", "--validate", "--fail-on-warn", "--file", os.devnull)


def test_session_authentication_serves_the_browsable_api(client, user):
    client.force_login(user)
    response = client.get("/api/tasks/", HTTP_ACCEPT="application/json")
    assert response.status_code == 200
    assert response.json()["count"] == 0
    page = client.get("/api/tasks/", HTTP_ACCEPT="text/html")
    assert page.status_code == 200
    assert page["Content-Type"].startswith("text/html")
    assert b"Django REST framework" in page.content
