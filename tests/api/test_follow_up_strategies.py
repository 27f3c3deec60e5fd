"""A follow-up sent while a turn runs: reject, enqueue, interrupt or rollback, through the API.

Each strategy is checked by what the product sees (status codes, the task's turns and queued
messages) and by what the model finally receives (the next dispatched prompt)."""

from __future__ import annotations

import pytest
from django.test import override_settings

from backend.tasks.models import QueuedMessage, Subtask, Task
from tests.dispatch.test_dispatch_api import PIPELINE, SINGLE, create, dispatch, report

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("pipeline_bots")]


def send(api, task, message, **body):
    return api.post(
        f"/api/tasks/{task['id']}/messages/", {"message": message, **body}, format="json"
    )


def detail(api, task) -> dict:
    response = api.get(f"/api/tasks/{task['id']}/")
    assert response.status_code == 200
    return response.json()


def progress(worker_api, turn, partial_text):
    response = worker_api.post(
        f"/api/executor/subtasks/{turn['subtask_id']}/progress/",
        {"worker_id": "w1", "attempt": turn["attempt"], "events": [], "partial_text": partial_text},
        format="json",
    )
    assert response.status_code == 200, response.json()


def heartbeat_state(worker_api, turn) -> str:
    response = worker_api.post(
        f"/api/executor/subtasks/{turn['subtask_id']}/heartbeat/",
        {"worker_id": "w1", "attempt": turn["attempt"]},
        format="json",
    )
    return "running" if response.status_code == 200 else response.json()["code"]


def rows(task) -> list[tuple[int, str, str, str]]:
    return list(
        Subtask.objects.filter(task_id=task["id"])
        .order_by("message_id")
        .values_list("message_id", "role", "status", "error_code")
    )


def test_the_default_strategy_is_enqueue_and_a_task_says_which_it_uses(api):
    task = create(api)
    assert task["follow_up_strategy"] == "enqueue"
    assert task["queued_messages"] == []
    strict = create(api, {**SINGLE, "follow_up_strategy": "reject"})
    assert strict["follow_up_strategy"] == "reject"
    with override_settings(BATON_FOLLOW_UP_STRATEGY="interrupt"):
        assert detail(api, task)["follow_up_strategy"] == "interrupt"
        assert detail(api, strict)["follow_up_strategy"] == "reject"


def test_reject_is_a_409_that_stores_nothing(api):
    task = create(api, {**SINGLE, "follow_up_strategy": "reject"})
    response = send(api, task, "and also this")
    assert response.status_code == 409
    assert "strategy enqueue, interrupt, rollback or steer" in response.json()["detail"]
    assert rows(task) == [(1, "USER", "COMPLETED", ""), (2, "ASSISTANT", "PENDING", "")]
    assert not QueuedMessage.objects.exists()
    # A follow-up may choose for itself, whatever its task says.
    assert send(api, task, "and also this", strategy="enqueue").status_code == 202


def test_queued_follow_ups_are_answered_in_order_after_the_running_turn(api, worker_api):
    task = create(api)
    [first] = dispatch(worker_api)
    queued = []
    for text in ["second", "third", "fourth"]:
        response = send(api, task, text)
        assert response.status_code == 202, response.json()
        assert response.json()["status"] == "queued" and response.json()["turn"] is None
        queued.append(response.json())
    shown = detail(api, task)
    assert shown["status"] == "RUNNING"
    assert [q["message"] for q in shown["queued_messages"]] == ["second", "third", "fourth"]
    assert [t["message_id"] for t in shown["turns"]] == [1, 2]  # nothing queued is a turn yet
    assert dispatch(worker_api) == []  # nothing is dispatchable while the turn runs

    answered = []
    turn = first
    for expected in ["second", "third", "fourth"]:
        answer = {"value": f"answer to {turn['message_id']}"}
        assert report(worker_api, turn, result=answer).status_code == 200
        [turn] = dispatch(worker_api)
        # The queued message became the current message, after everything before it.
        assert turn["prompt"].endswith(f"## Current Message\n\nUser:\n{expected}\n")
        assert f"answer to {turn['message_id'] - 2}" in turn["prompt"]
        answered.append((turn["message_id"], expected))
    assert report(worker_api, turn, result={"value": "last"}).status_code == 200
    assert answered == [(4, "second"), (6, "third"), (8, "fourth")]
    assert [row[:3] for row in rows(task)] == [
        (1, "USER", "COMPLETED"),
        (2, "ASSISTANT", "COMPLETED"),
        (3, "USER", "COMPLETED"),
        (4, "ASSISTANT", "COMPLETED"),
        (5, "USER", "COMPLETED"),
        (6, "ASSISTANT", "COMPLETED"),
        (7, "USER", "COMPLETED"),
        (8, "ASSISTANT", "COMPLETED"),
    ]
    sent = list(QueuedMessage.objects.order_by("id").values_list("status", "subtask__message_id"))
    assert sent == [("sent", 3), ("sent", 5), ("sent", 7)]
    final = detail(api, task)
    assert final["status"] == "COMPLETED" and final["queued_messages"] == []


def test_a_queued_message_waits_for_every_pipeline_step(api, worker_api):
    task = create(api, PIPELINE)
    [coder] = dispatch(worker_api, kinds=["codex", "claude_code"])
    assert send(api, task, "next, please").status_code == 202
    report(worker_api, coder, result={"value": "patched"})
    [reviewer] = dispatch(worker_api, kinds=["codex", "claude_code"])
    assert reviewer["message_id"] == 3  # the round's second step, not the queued message
    assert detail(api, task)["queued_messages"][0]["message"] == "next, please"
    report(worker_api, reviewer, result={"value": "looks good"})
    [next_coder] = dispatch(worker_api, kinds=["codex", "claude_code"])
    assert next_coder["message_id"] == 5 and "next, please" in next_coder["prompt"]


def test_a_failed_or_stopped_turn_also_lets_the_queue_go_on(api, worker_api):
    task = create(api)
    [turn] = dispatch(worker_api)
    send(api, task, "after the failure")
    send(api, task, "after the stop")
    report(worker_api, turn, status="FAILED", error="boom")
    [turn] = dispatch(worker_api)
    assert turn["message_id"] == 4
    response = api.post(f"/api/tasks/{task['id']}/subtasks/{turn['subtask_id']}/cancel/")
    assert response.status_code == 200
    [turn] = dispatch(worker_api)
    assert turn["message_id"] == 6 and "after the stop" in turn["prompt"]


def test_a_queued_message_can_be_withdrawn_once(api, worker_api):
    task = create(api)
    [turn] = dispatch(worker_api)
    keep = send(api, task, "keep me").json()
    drop = send(api, task, "drop me").json()
    url = f"/api/tasks/{task['id']}/queued-messages/{drop['id']}/cancel/"
    response = api.post(url)
    assert (response.status_code, response.json()["status"]) == (200, "cancelled")
    assert api.post(url).status_code == 409
    assert [q["id"] for q in detail(api, task)["queued_messages"]] == [keep["id"]]
    report(worker_api, turn, result={"value": "done"})
    [turn] = dispatch(worker_api)
    report(worker_api, turn, result={"value": "done again"})
    assert dispatch(worker_api) == []  # the withdrawn message was never sent
    assert detail(api, task)["status"] == "COMPLETED"


def test_the_queue_is_bounded(api, worker_api, settings):
    settings.BATON_MAX_QUEUED_MESSAGES = 2
    task = create(api)
    dispatch(worker_api)
    assert send(api, task, "one").status_code == 202
    assert send(api, task, "two").status_code == 202
    response = send(api, task, "three")
    assert response.status_code == 409
    assert "BATON_MAX_QUEUED_MESSAGES" in response.json()["detail"]
    assert QueuedMessage.objects.count() == 2


def test_cancelling_the_task_cancels_its_queue(api, worker_api):
    task = create(api)
    dispatch(worker_api)
    send(api, task, "later")
    assert api.post(f"/api/tasks/{task['id']}/cancel/").status_code == 200
    assert list(QueuedMessage.objects.values_list("status", flat=True)) == ["cancelled"]
    assert detail(api, task)["queued_messages"] == []


def test_interrupt_keeps_what_the_running_turn_wrote_and_starts_now(api, worker_api):
    task = create(api, {**PIPELINE, "follow_up_strategy": "interrupt"})
    [coder] = dispatch(worker_api, kinds=["codex", "claude_code"])
    progress(worker_api, coder, "I started by reading retry.py and")
    response = send(api, task, "Stop: use tenacity instead.")
    assert response.status_code == 201, response.json()
    assert [(t["message_id"], t["status"]) for t in response.json()] == [
        (4, "COMPLETED"),
        (5, "PENDING"),
        (6, "PENDING"),
    ]
    assert rows(task)[1:3] == [
        (2, "ASSISTANT", "INTERRUPTED", "interrupted"),
        (3, "ASSISTANT", "CANCELLED", "interrupted"),  # the step that never started
    ]
    # The worker is told to stop, and a late result is refused.
    assert heartbeat_state(worker_api, coder) == "cancelled"
    late = report(worker_api, coder, result={"value": "late"})
    assert (late.status_code, late.json()["code"]) == (409, "cancelled")
    [next_coder] = dispatch(worker_api, kinds=["codex", "claude_code"])
    assert next_coder["message_id"] == 5
    prompt = next_coder["prompt"]
    assert "Interrupted by the next message before it finished." in prompt
    assert "I started by reading retry.py and" in prompt
    assert prompt.index("I started by reading") < prompt.index("Stop: use tenacity instead.")


def test_interrupting_a_turn_that_has_not_started_cancels_it(api, worker_api):
    task = create(api)
    response = send(api, task, "never mind, do this", strategy="interrupt")
    assert response.status_code == 201
    assert rows(task)[1] == (2, "ASSISTANT", "CANCELLED", "interrupted")
    [turn] = dispatch(worker_api)
    assert "Interrupted" not in turn["prompt"]


def test_rollback_drops_the_running_turn_from_the_history(api, worker_api):
    task = create(api)
    [turn] = dispatch(worker_api)
    progress(worker_api, turn, "a half-written answer")
    response = send(api, task, "Start over: fix the flaky test.", strategy="rollback")
    assert response.status_code == 201, response.json()
    assert rows(task)[1] == (2, "ASSISTANT", "CANCELLED", "rolled_back")
    assert heartbeat_state(worker_api, turn) == "cancelled"
    [next_turn] = dispatch(worker_api)
    assert "a half-written answer" not in next_turn["prompt"]
    assert "Interrupted" not in next_turn["prompt"]
    # The user's earlier message is still part of the conversation.
    assert "CI is red." in next_turn["prompt"]


def test_messages_already_queued_wait_behind_an_interrupting_one(api, worker_api):
    task = create(api)
    [turn] = dispatch(worker_api)
    send(api, task, "queued first")
    response = send(api, task, "urgent", strategy="interrupt")
    assert response.status_code == 201
    [urgent] = dispatch(worker_api)
    assert urgent["message_id"] == 4 and "urgent" in urgent["prompt"]
    report(worker_api, urgent, result={"value": "done urgently"})
    [queued] = dispatch(worker_api)
    # Sent after the interrupting round, it reads that round in its history.
    assert queued["message_id"] == 6
    assert queued["prompt"].index("done urgently") < queued["prompt"].index("queued first")


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"message": "x", "strategy": "later"}, "strategy"),
        ({"message": "x", "strategy": None}, "strategy"),
    ],
)
def test_a_bad_strategy_is_a_400_naming_the_field(api, body, field):
    task = create(api)
    response = api.post(f"/api/tasks/{task['id']}/messages/", body, format="json")
    assert response.status_code == 400
    assert field in response.json()["fields"]
    bad_task = api.post("/api/tasks/", {**SINGLE, "follow_up_strategy": "soon"}, format="json")
    assert bad_task.status_code == 400
    assert "follow_up_strategy" in bad_task.json()["fields"]


def test_another_users_queue_is_out_of_reach(api, other_api, worker_api):
    task = create(api)
    dispatch(worker_api)
    queued = send(api, task, "mine").json()
    assert send(other_api, task, "theirs").status_code == 404
    url = f"/api/tasks/{task['id']}/queued-messages/{queued['id']}/cancel/"
    assert other_api.post(url).status_code == 404
    assert Task.objects.get(pk=task["id"]).queued_messages.get().status == "queued"
