"""Strategy steer through the API: a follow-up handed to the running turn's worker.

Checked by what the product sees (the 202, the task's turns, queue and events), by what the
worker is handed and asked (its heartbeat), and by what the model finally receives (the next
dispatched prompt): a steer is answered once, by the turn that received it or by a round of
its own, never lost and never twice.
"""

from __future__ import annotations

import pytest
from django.db.models import Q

from backend.tasks.models import QueuedMessage, Steer, Subtask, TaskEvent
from tests.api.test_follow_up_strategies import detail, rows, send
from tests.conftest import make_worker, token_client
from tests.dispatch.test_dispatch_api import PIPELINE, SINGLE, create, dispatch, report

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("pipeline_bots")]


def heartbeat(worker_api, turn, *, steers=(), worker_id="w1") -> dict:
    """The batched heartbeat for one claim, saying what became of `steers` (id, refusal)."""
    entry = {"subtask_id": turn["subtask_id"], "attempt": turn["attempt"]}
    if steers:
        entry["steers"] = [
            {"steer_id": steer_id, "delivered": refusal is None, "refusal": refusal}
            for steer_id, refusal in steers
        ]
    response = worker_api.post(
        "/api/executor/heartbeat/", {"worker_id": worker_id, "turns": [entry]}, format="json"
    )
    assert response.status_code == 200, response.json()
    [state] = response.json()["turns"]
    return state


def steer(api, task, text="also cover the Windows path") -> dict:
    response = send(api, task, text, strategy="steer")
    assert response.status_code == 202, response.json()
    return response.json()


def event_types(task) -> list[str]:
    return list(
        TaskEvent.objects.filter(task_id=task["id"]).order_by("seq").values_list("type", flat=True)
    )


def test_a_steer_is_a_user_turn_at_once_offered_once_to_the_worker(api, worker_api):
    task = create(api)
    [turn] = dispatch(worker_api)
    body = steer(api, task)
    assert body["steered"] is True
    assert body["status"] == "pending"
    assert (body["message_id"], body["target"], body["target_message_id"]) == (
        3,
        turn["subtask_id"],
        2,
    )
    assert body["attempt"] == 1 and body["fallback_reason"] == ""
    # Stored at once, in order, and the task still runs the turn it was given to.
    assert [row[:3] for row in rows(task)] == [
        (1, "USER", "COMPLETED"),
        (2, "ASSISTANT", "RUNNING"),
        (3, "USER", "COMPLETED"),
    ]
    shown = detail(api, task)
    assert shown["status"] == "RUNNING" and shown["queued_messages"] == []
    assert shown["turns"][2]["message"] == "also cover the Windows path"

    offer = {"steer_id": body["steer_id"], "message": "also cover the Windows path"}
    assert heartbeat(worker_api, turn)["steers"] == [offer]
    # Handed over once: the next heartbeats carry no text while the agent takes it in.
    assert "steers" not in heartbeat(worker_api, turn)
    state = heartbeat(worker_api, turn, steers=[(body["steer_id"], None)])
    assert "steers" not in state and state["state"] == "running"
    # The same answer again (its heartbeat's answer was lost) changes nothing.
    heartbeat(worker_api, turn, steers=[(body["steer_id"], None)])
    steer_row = Steer.objects.get(pk=body["steer_id"])
    assert steer_row.status == "delivered" and steer_row.delivered_at is not None
    assert event_types(task).count("turn.steered") == 1

    # The running turn's answer answers both: no round of its own, nothing queued.
    assert report(worker_api, turn, result={"value": "done, Windows too"}).status_code == 200
    assert [row[:3] for row in rows(task)] == [
        (1, "USER", "COMPLETED"),
        (2, "ASSISTANT", "COMPLETED"),
        (3, "USER", "COMPLETED"),
    ]
    final = detail(api, task)
    assert final["status"] == "COMPLETED" and final["queued_messages"] == []
    assert dispatch(worker_api) == []
    # The next follow-up is an ordinary round after it.
    assert send(api, task, "thanks").status_code == 201
    [after] = dispatch(worker_api)
    assert after["message_id"] == 5
    assert "also cover the Windows path" in after["prompt"]


def test_each_steers_text_is_offered_once_and_a_new_steer_alone_after_it(api, worker_api):
    task = create(api)
    [turn] = dispatch(worker_api)
    first = steer(api, task, "x" * 100_000)
    assert [offer["steer_id"] for offer in heartbeat(worker_api, turn)["steers"]] == [
        first["steer_id"]
    ]
    assert "steers" not in heartbeat(worker_api, turn)
    second = steer(api, task, "and the docs")
    assert heartbeat(worker_api, turn)["steers"] == [
        {"steer_id": second["steer_id"], "message": "and the docs"}
    ]
    assert "steers" not in heartbeat(worker_api, turn)
    # Offered once is still waiting for the worker's word, which settles it as before.
    assert Steer.objects.get(pk=first["steer_id"]).status == "pending"
    heartbeat(worker_api, turn, steers=[(first["steer_id"], None), (second["steer_id"], None)])
    assert set(Steer.objects.values_list("status", flat=True)) == {"delivered"}
    assert report(worker_api, turn, result={"value": "both"}).status_code == 200
    assert detail(api, task)["status"] == "COMPLETED" and dispatch(worker_api) == []


def test_a_steer_offered_to_a_claim_that_never_answered_is_answered_by_its_own_round(
    api, worker_api
):
    task = create(api)
    [turn] = dispatch(worker_api)
    body = steer(api, task, "steered")
    assert heartbeat(worker_api, turn)["steers"]  # its answer lost on the way, say
    assert "steers" not in heartbeat(worker_api, turn)  # never offered again
    assert report(worker_api, turn, result={"value": "first"}).status_code == 200
    steer_row = Steer.objects.get(pk=body["steer_id"])
    assert (steer_row.status, steer_row.fallback_reason) == ("queued", "attempt_ended")
    [own] = dispatch(worker_api)
    assert own["prompt"].endswith("## Current Message\n\nUser:\nsteered\n")


def refused_for_room(response) -> None:
    """The 409 of a follow-up with no room left: it names the field and the setting."""
    assert response.status_code == 409, response.json()
    error = response.json()
    assert error["code"] == "conflict" and "BATON_MAX_QUEUED_MESSAGES" in error["detail"]
    assert error["fields"] == {"message": [error["detail"]]}


def test_steers_a_turn_has_not_answered_count_towards_the_queue_limit(api, worker_api, settings):
    settings.BATON_MAX_QUEUED_MESSAGES = 2
    task = create(api)
    [turn] = dispatch(worker_api)
    first, second = steer(api, task, "one"), steer(api, task, "two")
    refused_for_room(send(api, task, "three", strategy="steer"))
    refused_for_room(send(api, task, "four", strategy="enqueue"))
    # Delivered is not answered yet: the attempt may still end without an answer, and then
    # they go to the queue, which stays within its limit.
    heartbeat(worker_api, turn, steers=[(first["steer_id"], None), (second["steer_id"], None)])
    refused_for_room(send(api, task, "five", strategy="steer"))
    assert Steer.objects.count() == 2 and len(rows(task)) == 4
    assert not QueuedMessage.objects.exists()
    assert heartbeat(worker_api, turn)["state"] == "running"
    # Answered by the turn: room again.
    assert report(worker_api, turn, result={"value": "all three"}).status_code == 200
    assert send(api, task, "six", strategy="steer").status_code == 201


def test_the_last_steer_the_counter_holds_is_followed_by_a_409_not_a_500(api, worker_api, settings):
    settings.BATON_MAX_QUEUED_MESSAGES = 32767  # the most the setting allows
    task = create(api)
    [turn] = dispatch(worker_api)
    # As if 32766 steers were open: the turn's counter is a smallint.
    Subtask.objects.filter(pk=turn["subtask_id"]).update(steers_open=32766)
    steer(api, task, "the last one")
    refused_for_room(send(api, task, "one too many", strategy="steer"))
    assert Subtask.objects.get(pk=turn["subtask_id"]).steers_open == 32767


def test_a_steer_refused_by_the_worker_leaves_its_place_to_the_queue(api, worker_api, settings):
    settings.BATON_MAX_QUEUED_MESSAGES = 2
    task = create(api)
    [turn] = dispatch(worker_api)
    assert send(api, task, "queued", strategy="enqueue").status_code == 202
    body = steer(api, task, "steered")
    refused_for_room(send(api, task, "one more", strategy="steer"))
    heartbeat(worker_api, turn, steers=[(body["steer_id"], "finished")])
    # The steer is a queued message now: still two waiting.
    assert QueuedMessage.objects.filter(status="queued").count() == 2
    refused_for_room(send(api, task, "one more", strategy="enqueue"))


def test_a_steer_the_executor_refused_falls_back_to_a_round_after_the_running_turn(api, worker_api):
    task = create(api)
    [turn] = dispatch(worker_api)
    body = steer(api, task, "and the migrations")
    heartbeat(worker_api, turn, steers=[(body["steer_id"], "finished")])
    steer_row = Steer.objects.get(pk=body["steer_id"])
    assert (steer_row.status, steer_row.fallback_reason) == ("queued", "finished")
    [queued] = detail(api, task)["queued_messages"]
    assert queued["turn"] == steer_row.message_id and queued["status"] == "queued"
    assert "steers" not in heartbeat(worker_api, turn)
    assert dispatch(worker_api) == []  # it waits for the running turn

    assert report(worker_api, turn, result={"value": "first answer"}).status_code == 200
    [answer] = dispatch(worker_api)
    # Its own round answers the stored turn: no second USER turn, answered after the first.
    assert answer["message_id"] == 4
    assert answer["prompt"].endswith("## Current Message\n\nUser:\nand the migrations\n")
    assert "first answer" in answer["prompt"]
    assert report(worker_api, answer, result={"value": "second"}).status_code == 200
    assert [row[:3] for row in rows(task)] == [
        (1, "USER", "COMPLETED"),
        (2, "ASSISTANT", "COMPLETED"),
        (3, "USER", "COMPLETED"),
        (4, "ASSISTANT", "COMPLETED"),
    ]
    assert Subtask.objects.get(task_id=task["id"], message_id=3).steered_into_message_id is None
    assert detail(api, task)["status"] == "COMPLETED"


def test_a_steer_still_waiting_when_the_turn_completes_falls_back_before_queued_messages(
    api, worker_api
):
    task = create(api)
    [turn] = dispatch(worker_api)
    assert send(api, task, "queued first", strategy="enqueue").status_code == 202
    body = steer(api, task, "steered second")
    # The worker reports before it handed the steer over: the steer was not answered.
    assert report(worker_api, turn, result={"value": "answer"}).status_code == 200
    steer_row = Steer.objects.get(pk=body["steer_id"])
    assert (steer_row.status, steer_row.fallback_reason) == ("queued", "attempt_ended")
    [answer] = dispatch(worker_api)
    # The steer is a turn already (message 4, before anything the queue will start): first.
    assert answer["prompt"].endswith("## Current Message\n\nUser:\nsteered second\n")
    assert report(worker_api, answer, result={"value": "ok"}).status_code == 200
    [then] = dispatch(worker_api)
    assert then["prompt"].endswith("## Current Message\n\nUser:\nqueued first\n")


def test_the_report_settles_the_steers_it_names_before_the_result(api, worker_api):
    task = create(api)
    [turn] = dispatch(worker_api)
    body = steer(api, task)
    steers = [{"steer_id": body["steer_id"], "delivered": True}]
    assert report(worker_api, turn, result={"value": "both"}, steers=steers).status_code == 200
    assert Steer.objects.get(pk=body["steer_id"]).status == "delivered"
    assert QueuedMessage.objects.filter(task_id=task["id"]).count() == 0
    assert detail(api, task)["status"] == "COMPLETED"


def test_a_delivered_steer_whose_attempt_is_retried_gets_a_round_of_its_own(api, worker_api):
    task = create(api)
    [turn] = dispatch(worker_api)
    body = steer(api, task, "steer me")
    heartbeat(worker_api, turn, steers=[(body["steer_id"], None)])
    retry = {"status": "RETRY", "error": "503", "error_code": "upstream_error"}
    assert report(worker_api, turn, **retry).status_code == 200
    # The next attempt starts fresh from the prompt: it never saw the steer, so the steer
    # is answered by its own round, after that attempt.
    assert Steer.objects.get(pk=body["steer_id"]).status == "queued"
    Subtask.objects.filter(pk=turn["subtask_id"]).update(not_before=None)
    [again] = dispatch(worker_api)
    assert again["attempt"] == 2 and "steer me" not in again["prompt"]
    assert "steers" not in heartbeat(worker_api, again)
    assert report(worker_api, again, result={"value": "fixed"}).status_code == 200
    [own] = dispatch(worker_api)
    assert own["prompt"].endswith("## Current Message\n\nUser:\nsteer me\n")


def test_without_a_running_turn_that_can_take_it_a_steer_is_queued_and_says_why(api, worker_api):
    task = create(api)
    pending = send(api, task, "not yet", strategy="steer")
    assert pending.status_code == 202
    assert pending.json()["status"] == "queued"
    assert pending.json()["steer_fallback"] == "not_running"

    agno = create(api, {**SINGLE, "executor": "agno"})
    dispatch(worker_api, kinds=("agno",))
    response = send(api, agno, "steer agno", strategy="steer")
    assert response.status_code == 202
    assert response.json()["steer_fallback"] == "not_steerable"
    assert Steer.objects.count() == 0
    # An ordinary queued message answers no `steer_fallback`.
    plain = send(api, task, "plain", strategy="enqueue").json()
    assert plain["steer_fallback"] is None


def test_another_workers_word_about_a_steer_changes_nothing(api, worker_api):
    task = create(api)
    [turn] = dispatch(worker_api)
    body = steer(api, task)
    heartbeat(worker_api, turn, steers=[(body["steer_id"], None)], worker_id="w2")
    assert Steer.objects.get(pk=body["steer_id"]).status == "pending"
    assert heartbeat(worker_api, turn)["steers"][0]["steer_id"] == body["steer_id"]


@pytest.mark.parametrize("refusal", [None, "finished"])
def test_another_accounts_heartbeat_naming_the_worker_id_settles_nothing(
    api, worker_api, other_worker_api, refusal
):
    task = create(api)
    [turn] = dispatch(worker_api)
    body = steer(api, task, "steered")
    # Another worker account names the claim exactly: the turn, its attempt, its worker id.
    response = other_worker_api.post(
        "/api/executor/heartbeat/",
        {
            "worker_id": "w1",
            "turns": [
                {
                    "subtask_id": turn["subtask_id"],
                    "attempt": turn["attempt"],
                    "steers": [
                        {"steer_id": body["steer_id"], "delivered": refusal is None}
                        | ({"refusal": refusal} if refusal else {})
                    ],
                }
            ],
        },
        format="json",
    )
    assert response.status_code == 200
    [state] = response.json()["turns"]
    assert state["state"] == "lease_lost" and "steers" not in state
    assert Steer.objects.get(pk=body["steer_id"]).status == "pending"
    assert not QueuedMessage.objects.filter(task_id=task["id"]).exists()
    assert "turn.steered" not in event_types(task)
    # The worker holding the claim is still offered the steer, and its answer answers it.
    offered = heartbeat(worker_api, turn)["steers"]
    assert offered == [{"steer_id": body["steer_id"], "message": "steered"}]
    heartbeat(worker_api, turn, steers=[(body["steer_id"], None)])
    assert report(worker_api, turn, result={"value": "both"}).status_code == 200
    assert Steer.objects.get(pk=body["steer_id"]).status == "delivered"
    assert detail(api, task)["status"] == "COMPLETED" and dispatch(worker_api) == []


def test_another_accounts_result_naming_the_worker_id_is_a_404_that_settles_nothing(
    api, worker_api, other_worker_api
):
    task = create(api)
    [turn] = dispatch(worker_api)
    body = steer(api, task, "steered")
    steers = [{"steer_id": body["steer_id"], "delivered": True}]
    response = report(other_worker_api, turn, result={"value": "forged"}, steers=steers)
    assert response.status_code == 404
    assert Steer.objects.get(pk=body["steer_id"]).status == "pending"
    assert "turn.steered" not in event_types(task)
    # The turn ends without the steer, which is then answered by a round of its own.
    assert report(worker_api, turn, result={"value": "first"}).status_code == 200
    steer_row = Steer.objects.get(pk=body["steer_id"])
    assert (steer_row.status, steer_row.fallback_reason) == ("queued", "attempt_ended")
    [own] = dispatch(worker_api)
    assert own["prompt"].endswith("## Current Message\n\nUser:\nsteered\n")


def test_cancelling_the_task_cancels_its_steers(api, worker_api):
    task = create(api)
    [turn] = dispatch(worker_api)
    body = steer(api, task)
    assert api.post(f"/api/tasks/{task['id']}/cancel/").status_code == 200
    assert Steer.objects.get(pk=body["steer_id"]).status == "cancelled"
    assert not QueuedMessage.objects.filter(task_id=task["id"], status="queued").exists()


@pytest.mark.parametrize("strategy", ["interrupt", "rollback"])
def test_a_message_that_stops_a_steered_turn_answers_the_steer_too(api, worker_api, strategy):
    task = create(api)
    [turn] = dispatch(worker_api)
    body = steer(api, task, "steered")
    heartbeat(worker_api, turn, steers=[(body["steer_id"], None)])
    assert send(api, task, "stop, do this", strategy=strategy).status_code == 201
    assert Steer.objects.get(pk=body["steer_id"]).status == "superseded"
    [now] = dispatch(worker_api)
    # The new round's prompt shows the steer last in its history, then the new message.
    history, current = now["prompt"].split("## Current Message")
    assert "steered" in history and current == "\n\nUser:\nstop, do this\n"
    assert report(worker_api, now, result={"value": "done"}).status_code == 200
    assert dispatch(worker_api) == []  # no round of its own
    assert detail(api, task)["status"] == "COMPLETED"


def test_a_pipeline_steers_its_running_step(api, worker_api):
    task = create(api, PIPELINE)
    [coder] = dispatch(worker_api)
    body = steer(api, task, "keep it small")
    # Numbered after the round's two answers; the reviewer's step stays pending behind it.
    assert (body["message_id"], body["target_message_id"]) == (4, 2)
    heartbeat(worker_api, coder, steers=[(body["steer_id"], None)])
    assert report(worker_api, coder, result={"value": "small patch"}).status_code == 200
    [reviewer] = dispatch(worker_api, kinds=("claude_code",))
    assert reviewer["message_id"] == 3
    assert report(worker_api, reviewer, result={"value": "lgtm"}).status_code == 200
    assert detail(api, task)["status"] == "COMPLETED"
    assert dispatch(worker_api, kinds=("codex", "claude_code")) == []


@pytest.mark.parametrize(
    ("entry", "field"),
    [
        ({"steer_id": 1, "delivered": False}, "refusal"),
        ({"steer_id": 1, "delivered": True, "refusal": "finished"}, "refusal"),
        ({"steer_id": 1, "delivered": False, "refusal": "bored"}, "refusal"),
        ({"steer_id": 0, "delivered": True}, "steer_id"),
    ],
)
def test_a_bad_steer_result_is_a_400_naming_the_field(api, worker_api, entry, field):
    create(api)
    [turn] = dispatch(worker_api)
    response = worker_api.post(
        "/api/executor/heartbeat/",
        {
            "worker_id": "w1",
            "turns": [
                {"subtask_id": turn["subtask_id"], "attempt": turn["attempt"], "steers": [entry]}
            ],
        },
        format="json",
    )
    assert response.status_code == 400
    assert field in str(response.json())


def active_rounds(task) -> set[int]:
    """The rounds (by the USER message they answer) of the task with a turn running or
    claimable: a PENDING turn that is in line (a pipeline's later step is not, yet)."""
    return set(
        Subtask.objects.filter(task_id=task["id"], role="ASSISTANT", kind="turn")
        .filter(Q(status="RUNNING") | Q(status="PENDING", pending_since__isnull=False))
        .values_list("parent_message_id", flat=True)
    )


def test_a_fallen_back_steer_whose_round_is_released_runs_alone_and_in_order(api, worker_api):
    """A steer to a running turn falls back when that turn is retried; an `interrupt` starts
    its round now and an `enqueue` waits. The rounds run one at a time in the README's order:
    the interrupting message's, then the steer's (queued first, before messages queued as
    such), then the queued message's, even when the steer's round is given back once."""
    task = create(api)
    seen: list[set[int]] = []

    def one_round_at_most() -> None:
        seen.append(active_rounds(task))
        assert len(seen[-1]) <= 1, seen

    [turn] = dispatch(worker_api)
    steer(api, task, "steered")
    retry = {"status": "RETRY", "error": "503", "error_code": "upstream_error"}
    assert report(worker_api, turn, **retry).status_code == 200
    one_round_at_most()
    assert send(api, task, "interrupting", strategy="interrupt").status_code == 201
    one_round_at_most()
    assert send(api, task, "queued", strategy="enqueue").status_code == 202
    one_round_at_most()

    # Two workers of one account and one of another all dispatch: none gets a 500.
    workers = [(worker_api, "w1"), (worker_api, "w2"), (token_client(make_worker("other")), "w3")]
    answered = []
    released = False
    while True:
        claimed = [
            (client, worker_id, turn)
            for client, worker_id in workers
            for turn in dispatch(client, worker_id=worker_id)
        ]
        one_round_at_most()
        if not claimed:
            break
        [(client, worker_id, running)] = claimed
        answered.append(running["prompt"].rsplit("User:\n", 1)[1])
        if answered[-1] == "steered\n" and not released:
            released = True
            outcome = {"status": "RELEASE"}
        else:
            outcome = {"result": {"value": "ok"}}
        assert report(client, running, worker_id=worker_id, **outcome).status_code == 200
        one_round_at_most()
    assert answered == ["interrupting\n", "steered\n", "steered\n", "queued\n"]
    assert detail(api, task)["status"] == "COMPLETED"
