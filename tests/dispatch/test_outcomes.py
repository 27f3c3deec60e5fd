"""The executor API's outcomes beyond success: retry with backoff, release, cancel, lost lease,
the batched heartbeat, and what the task API shows of them."""

from __future__ import annotations

import json
from datetime import timedelta

import pytest
from django.db import connection
from django.utils import timezone

from backend.tasks.models import Subtask, Task
from tests.dispatch.test_dispatch_api import PIPELINE, SINGLE, create, dispatch, report

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("pipeline_bots")]


def dispatch_body(client, kinds=("codex",), worker_id="w1") -> dict:
    response = client.post(
        "/api/executor/dispatch/",
        {"kinds": list(kinds), "limit": 5, "worker_id": worker_id},
        format="json",
    )
    assert response.status_code == 200, response.json()
    return response.json()


def heartbeat(client, turns, worker_id="w1"):
    claims = [{"subtask_id": turn["subtask_id"], "attempt": turn["attempt"]} for turn in turns]
    response = client.post(
        "/api/executor/heartbeat/", {"worker_id": worker_id, "turns": claims}, format="json"
    )
    assert response.status_code == 200, response.json()
    return {state["subtask_id"]: state["state"] for state in response.json()["turns"]}


def test_a_retryable_failure_requeues_the_turn_after_a_backoff(api, worker_api, settings):
    settings.BATON_RETRY_BACKOFF_SECONDS = 30
    create(api)
    [turn] = dispatch(worker_api)
    response = report(
        worker_api,
        turn,
        status="RETRY",
        error="HTTP 500 from the model",
        error_code="upstream_error",
    )
    assert response.status_code == 200, response.json()
    assert response.json()["status"] == "PENDING"
    stored = Subtask.objects.get(pk=turn["subtask_id"])
    assert (stored.status, stored.error_code, stored.error) == (
        "PENDING",
        "upstream_error",
        "HTTP 500 from the model",
    )
    assert stored.not_before > timezone.now() + timedelta(seconds=25)
    # Nothing is claimable during the backoff, and an idle worker is told when to come back.
    idle = dispatch_body(worker_api)
    assert idle["turns"] == []
    assert 25 < idle["next_ready_in_seconds"] <= 30
    # The product sees why the turn is waiting.
    shown = api.get(f"/api/tasks/{turn['task_id']}/").json()["turns"][1]
    assert (shown["status"], shown["error_code"]) == ("PENDING", "upstream_error")
    assert shown["not_before"] is not None
    # After the backoff the turn is claimed again, as attempt 2, and can complete.
    Subtask.objects.filter(pk=turn["subtask_id"]).update(not_before=timezone.now())
    [again] = dispatch(worker_api)
    assert (again["subtask_id"], again["attempt"]) == (turn["subtask_id"], 2)
    assert report(worker_api, again, result={"value": "ok"}).status_code == 200
    stored.refresh_from_db()
    assert (stored.status, stored.error, stored.error_code) == ("COMPLETED", "", "")


def test_backoff_doubles_per_attempt_up_to_the_maximum(settings):
    from backend.dispatch.reports import retry_backoff_seconds

    settings.BATON_RETRY_BACKOFF_SECONDS = 10
    settings.BATON_RETRY_BACKOFF_MAX_SECONDS = 35
    assert [retry_backoff_seconds(attempt=n) for n in (1, 2, 3, 4)] == [10, 20, 35, 35]


def test_retries_stop_after_the_last_attempt_with_the_last_error(api, worker_api, settings):
    settings.BATON_RETRY_BACKOFF_SECONDS = 0
    settings.BATON_MAX_ATTEMPTS = 2
    task = create(api)
    for number in (1, 2):
        [turn] = dispatch(worker_api)
        assert turn["attempt"] == number
        body = {"status": "RETRY", "error": f"429 number {number}", "error_code": "rate_limited"}
        assert report(worker_api, turn, **body).status_code == 200
        # The same report again (a retried request) changes nothing.
        repeat = report(worker_api, turn, **body)
        assert (repeat.status_code, repeat.json()["changed"]) == (200, False)
    stored = Subtask.objects.get(pk=turn["subtask_id"])
    assert (stored.status, stored.error_code) == ("FAILED", "rate_limited")
    assert stored.error.startswith("429 number 2\n(attempt 2 of 2; Baton gave up")
    assert Task.objects.get(pk=task["id"]).status == "FAILED"
    assert dispatch_body(worker_api)["next_ready_in_seconds"] is None


def test_a_release_requeues_at_once_without_using_an_attempt(api, worker_api, settings):
    settings.BATON_MAX_ATTEMPTS = 1
    create(api)
    [turn] = dispatch(worker_api)
    response = report(worker_api, turn, status="RELEASE")
    assert response.status_code == 200, response.json()
    stored = Subtask.objects.get(pk=turn["subtask_id"])
    assert (stored.status, stored.releases, stored.error_code, stored.not_before) == (
        "PENDING",
        1,
        "shutdown",
        None,
    )
    [again] = dispatch(worker_api, worker_id="w2")  # one attempt allowed, none used yet
    assert again["attempt"] == 2
    late = report(worker_api, turn, status="RELEASE", error_code="other")
    assert (late.status_code, late.json()["code"]) == (409, "lease_lost")


def test_cancelling_one_running_turn_stops_the_worker_and_keeps_the_task_open(api, worker_api):
    task = create(api)
    [turn] = dispatch(worker_api)
    response = api.post(f"/api/tasks/{task['id']}/subtasks/{turn['subtask_id']}/cancel/")
    assert response.status_code == 200, response.json()
    assert [(t["status"], t["error_code"]) for t in response.json()] == [("CANCELLED", "cancelled")]
    # The worker is told "cancelled" — not a lost lease — on every channel.
    assert heartbeat(worker_api, [turn]) == {turn["subtask_id"]: "cancelled"}
    url = f"/api/executor/subtasks/{turn['subtask_id']}"
    claim = {"worker_id": "w1", "attempt": 1}
    for path, body in [
        ("heartbeat", claim),
        ("progress", {**claim, "events": []}),
        ("result", {**claim, "status": "COMPLETED", "result": {"value": "late"}}),
    ]:
        answer = worker_api.post(f"{url}/{path}/", body, format="json")
        assert (answer.status_code, answer.json()["code"]) == (409, "cancelled"), path
    assert Subtask.objects.get(pk=turn["subtask_id"]).result is None
    # The task takes a follow-up, which is answered as usual.
    assert Task.objects.get(pk=task["id"]).status == "COMPLETED"
    follow_up = api.post(f"/api/tasks/{task['id']}/messages/", {"message": "again"}, format="json")
    assert follow_up.status_code == 201, follow_up.json()
    [next_turn] = dispatch(worker_api)
    assert next_turn["message_id"] == 4


def test_cancelling_a_pipeline_step_cancels_the_steps_after_it(api, worker_api):
    task = create(api, PIPELINE)
    [coder] = dispatch(worker_api, kinds=["codex", "claude_code"])
    response = api.post(f"/api/tasks/{task['id']}/subtasks/{coder['subtask_id']}/cancel/")
    assert [(t["bot"], t["status"]) for t in response.json()] == [
        ("coder", "CANCELLED"),
        ("reviewer", "CANCELLED"),
    ]
    assert dispatch(worker_api, kinds=["codex", "claude_code"]) == []
    again = api.post(f"/api/tasks/{task['id']}/subtasks/{coder['subtask_id']}/cancel/")
    assert (again.status_code, again.json()["code"]) == (409, "conflict")


def test_turn_cancel_is_scoped_to_the_owner_and_to_assistant_turns(api, other_api, worker_api):
    task = create(api)
    [turn] = dispatch(worker_api)
    url = f"/api/tasks/{task['id']}/subtasks/{turn['subtask_id']}/cancel/"
    assert other_api.post(url).status_code == 404
    user_turn = Subtask.objects.get(task_id=task["id"], role="USER")
    assert api.post(f"/api/tasks/{task['id']}/subtasks/{user_turn.pk}/cancel/").status_code == 404
    assert worker_api.post(url).status_code == 403
    assert Subtask.objects.get(pk=turn["subtask_id"]).status == "RUNNING"


def test_a_lost_lease_has_its_own_code(api, worker_api):
    create(api)
    [turn] = dispatch(worker_api, worker_id="slow")
    Subtask.objects.filter(pk=turn["subtask_id"]).update(
        lease_expires_at=timezone.now() - timedelta(seconds=1)
    )
    [again] = dispatch(worker_api, worker_id="fast")
    late = report(worker_api, turn, worker_id="slow", result={"value": "late"})
    assert (late.status_code, late.json()["code"]) == (409, "lease_lost")
    assert heartbeat(worker_api, [turn], worker_id="slow") == {turn["subtask_id"]: "lease_lost"}
    assert heartbeat(worker_api, [again], worker_id="fast") == {again["subtask_id"]: "running"}


def test_the_batched_heartbeat_renews_only_leases_that_are_due(
    api, worker_api, other_worker_api, django_assert_num_queries
):
    for _ in range(3):
        create(api)
    turns = dispatch(worker_api)
    fresh = {t.pk: t.lease_expires_at for t in Subtask.objects.filter(status="RUNNING")}
    # Just claimed: nothing is due, so the heartbeat only reads (one read; the token's account
    # is remembered from the dispatch, see backend.api.authentication).
    with django_assert_num_queries(1):
        assert set(heartbeat(worker_api, turns).values()) == {"running"}
    assert {t.pk: t.lease_expires_at for t in Subtask.objects.filter(status="RUNNING")} == fresh
    # One lease is nearly over: that one is renewed.
    due = turns[0]["subtask_id"]
    Subtask.objects.filter(pk=due).update(lease_expires_at=timezone.now() + timedelta(seconds=5))
    heartbeat(worker_api, turns)
    renewed = Subtask.objects.get(pk=due).lease_expires_at
    assert renewed > timezone.now() + timedelta(seconds=500)
    # Another worker account learns nothing about these turns and renews nothing.
    assert set(heartbeat(other_worker_api, turns).values()) == {"lease_lost"}
    # Finished turns say so.
    report(worker_api, turns[1], result={"value": "done"})
    assert heartbeat(worker_api, turns)[turns[1]["subtask_id"]] == "finished"


def test_heartbeat_input_errors_name_the_field(worker_api):
    for body, field in [
        ({"turns": []}, "worker_id"),
        ({"worker_id": "w", "turns": [{"subtask_id": 0, "attempt": 1}]}, "turns.0.subtask_id"),
        ({"worker_id": "w", "turns": [{"subtask_id": 1}]}, "turns.0.attempt"),
    ]:
        response = worker_api.post("/api/executor/heartbeat/", body, format="json")
        assert response.status_code == 400
        assert field in response.json()["fields"], response.json()


def test_the_task_api_shows_usage_session_and_error_code_per_turn(api, worker_api):
    task = create(api, PIPELINE)
    [coder] = dispatch(worker_api, kinds=["codex", "claude_code"])
    usage = {
        "input_tokens": 1200,
        "cached_input_tokens": 1000,
        "cache_write_input_tokens": 0,
        "output_tokens": 80,
        "reasoning_tokens": 16,
        "cost_usd": 0.0042,
        "model": "gpt-5.5",
    }
    answer = {"value": "patched", "commands": [{"command": "pytest", "exit_code": 0}]}
    response = report(worker_api, coder, result=answer, usage=usage, native_session_id="thread-1")
    assert response.status_code == 200, response.json()
    [reviewer] = dispatch(worker_api, kinds=["codex", "claude_code"])
    report(
        worker_api,
        reviewer,
        status="FAILED",
        error="Prompt is too long",
        error_code="context_overflow",
    )
    turns = api.get(f"/api/tasks/{task['id']}/").json()["turns"]
    assert (turns[1]["usage"], turns[1]["native_session_id"], turns[1]["result"]) == (
        usage,
        "thread-1",
        answer,
    )
    assert (turns[2]["status"], turns[2]["error_code"], turns[2]["usage"]) == (
        "FAILED",
        "context_overflow",
        None,
    )


def test_idle_dispatch_says_when_nothing_is_pending(api, worker_api):
    assert dispatch_body(worker_api) == {"turns": [], "next_ready_in_seconds": None}
    create(api, {**SINGLE, "executor": "agno"})
    assert dispatch_body(worker_api)["next_ready_in_seconds"] is None  # not a kind it serves
    assert dispatch_body(worker_api, kinds=["agno"])["next_ready_in_seconds"] is None  # claimed


def test_the_schema_documents_results_and_usage(api):
    schema = api.get("/api/schema/?format=json").json()
    usage = schema["components"]["schemas"]["UsageFields"]["properties"]
    assert {"input_tokens", "cached_input_tokens", "output_tokens", "reasoning_tokens"} <= set(
        usage
    )
    result = schema["components"]["schemas"]["ResultInput"]["properties"]
    assert "value" in result["result"]["properties"]
    statuses = schema["components"]["schemas"]["ReportedStatusEnum"]["enum"]
    assert statuses == ["COMPLETED", "FAILED", "RETRY", "RELEASE"]


def test_a_result_report_runs_a_fixed_number_of_statements(
    api, worker_api, django_assert_num_queries
):
    """A worker's result, nothing queued after it: the transaction (here a savepoint and its
    release) locking the task and the turn with it (one statement on PostgreSQL; elsewhere
    locking the task, then reading the turn), storing the result, the `turn.completed`
    event (one statement on PostgreSQL; elsewhere reading the task's next number, reserving
    it, then inserting the event), the latest
    round's statuses with whether a message is queued (one statement), the task's status, the
    owner's webhooks, the prompt report marked sent."""
    for _ in range(2):
        create(api)
    first, second = dispatch(worker_api)
    report(worker_api, first, result={"value": "warm"})  # the token's account, remembered
    with django_assert_num_queries(9 if connection.vendor == "postgresql" else 12):
        assert report(worker_api, second, result={"value": "Done."}).status_code == 200
    assert Subtask.objects.get(pk=second["subtask_id"]).status == "COMPLETED"
    assert Task.objects.get(pk=second["task_id"]).status == "COMPLETED"


@pytest.mark.parametrize("status", ["FAILED", "RETRY"])
def test_an_error_with_nul_or_a_lone_surrogate_is_stored_not_refused(api, worker_api, status):
    """An executor's error text is its stderr: binary output or a cut emoji in it must not
    make Baton refuse the whole report (the turn would then wait for its lease to run out)."""
    create(api, SINGLE)
    [turn] = dispatch(worker_api)
    body = {"worker_id": "w1", "attempt": turn["attempt"], "status": status, "error_code": "x"}
    # As a worker sends it: JSON escapes (`\u0000`, `\ud83d`), valid UTF-8 on the wire.
    answer = worker_api.post(
        f"/api/executor/subtasks/{turn['subtask_id']}/result/",
        json.dumps({**body, "error": "boom\x00 \ud83d!"}),
        content_type="application/json",
    )
    assert answer.status_code == 200, answer.content
    row = Subtask.objects.get(pk=turn["subtask_id"])
    assert row.error.startswith("boom\ufffd \ufffd!")
