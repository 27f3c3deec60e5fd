"""Recovery from context overflow, over the executor API: a resumed native session that overflowed
is retried once in a fresh session with the full prompt; a full prompt the model refused as too
long is requeued with half the budget and a fresh session, a bounded number of times, and then
fails saying what was tried; the overflowed attempts never reach a later prompt's history."""

from __future__ import annotations

import pytest

from backend.dispatch.budgets import effective_max_tokens
from backend.dispatch.models import PromptReport
from backend.dispatch.policies import resolve_policy, set_policy
from backend.dispatch.replay import replay_prompt
from backend.prompting.units import count_tokens
from backend.tasks.models import Bot, Subtask, Task
from tests.dispatch.test_dispatch_api import SINGLE, create, dispatch, report

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("pipeline_bots")]

# About 8,000 tokens, under the current message's character cap: sent whole at first.
BUILD_LOG = "\n".join(f"step {n}: compile module {n} of the build" for n in range(700))
OVERFLOW = {
    "status": "FAILED",
    "error": "Codex ran out of room in the model's context window.",
    "error_code": "context_overflow",
}


@pytest.fixture(autouse=True)
def bots_of_unknown_models(db):
    """These tests are about the turn's own cap, so no model window sets a budget: the bots'
    models are ones the model table does not list (their prompts counted with cl100k)."""
    Bot.objects.update(model="", context_window=None)


def big_task(api) -> dict:
    return create(api, {**SINGLE, "message": BUILD_LOG})


def full_report(turn) -> PromptReport:
    return PromptReport.objects.get(
        subtask_id=turn["subtask_id"], attempt=turn["attempt"], kind="full"
    )


def overflow(worker_api, turn, **body):
    response = report(worker_api, turn, **{**OVERFLOW, **body})
    assert response.status_code == 200, response.json()
    return response.json()


def test_an_overflow_is_retried_with_half_the_budget_and_the_report_says_why(
    api, worker_api, settings
):
    settings.BATON_MAX_ATTEMPTS = 1  # overflow retries use no attempt
    task = big_task(api)
    [first] = dispatch(worker_api)
    assert first["prompt"] == BUILD_LOG
    tokens = full_report(first).tokens
    assert tokens == count_tokens(BUILD_LOG) > 4_000
    assert full_report(first).token_budget is None  # the policy has no token cap

    assert overflow(worker_api, first)["status"] == "PENDING"
    stored = Subtask.objects.get(pk=first["subtask_id"])
    assert (stored.status, stored.error_code, stored.token_cap) == (
        "PENDING",
        "context_overflow",
        tokens // 2,
    )
    assert stored.not_before is None  # no backoff: a smaller prompt is ready now

    [second] = dispatch(worker_api)
    assert (second["subtask_id"], second["attempt"]) == (first["subtask_id"], 2)
    row = full_report(second)
    assert (row.retry_reason, row.previous_token_budget, row.token_budget) == (
        "context_overflow",
        tokens,
        tokens // 2,
    )
    assert row.policy_snapshot["max_tokens"] == tokens // 2
    assert row.tokens <= tokens // 2
    assert count_tokens(second["prompt"]) == row.tokens
    # The message was cut head + tail to fit, and points to its whole text.
    assert second["prompt"].startswith("## Current Message\n\nUser:\nstep 0: compile")
    assert "chars truncated" in second["prompt"]
    assert "[artifact " in second["prompt"]

    assert report(worker_api, second, result={"value": "Built."}).status_code == 200
    stored.refresh_from_db()
    assert (stored.status, stored.error, stored.error_code) == ("COMPLETED", "", "")
    assert Task.objects.get(pk=task["id"]).status == "COMPLETED"


def test_a_turn_that_keeps_overflowing_fails_with_the_budgets_it_tried(api, worker_api, settings):
    settings.BATON_CONTEXT_OVERFLOW_RETRIES = 2
    task = big_task(api)
    tried = []
    for attempt in (1, 2, 3):
        [turn] = dispatch(worker_api)
        assert turn["attempt"] == attempt
        row = full_report(turn)
        tried.append((row.tokens, row.token_budget))
        overflow(worker_api, turn, error="prompt is too long: 9000 tokens > 4000 maximum")
    assert dispatch(worker_api) == []  # no retry is left: the thrash loop ends
    (t1, cap1), (t2, cap2), (t3, cap3) = tried
    assert (cap1, cap2, cap3) == (None, t1 // 2, t2 // 2)
    stored = Subtask.objects.get(pk=turn["subtask_id"])
    assert (stored.status, stored.error_code, stored.attempts) == (
        "FAILED",
        "context_overflow",
        3,
    )
    assert stored.error == (
        "The prompt did not fit the model's context window ("
        f"attempt 1: {t1} tokens under no token cap; "
        f"attempt 2: {t2} tokens under a {cap2}-token budget; "
        f"attempt 3: {t3} tokens under a {cap3}-token budget). "
        "Baton gave up after 2 retries with a halved budget "
        "(BATON_CONTEXT_OVERFLOW_RETRIES=2). "
        "The executor's last error: prompt is too long: 9000 tokens > 4000 maximum"
    )
    assert Task.objects.get(pk=task["id"]).status == "FAILED"


def test_a_prompt_already_at_the_smallest_budget_fails_at_once(api, worker_api):
    create(api)  # "CI is red.": a few tokens
    [turn] = dispatch(worker_api)
    tokens = full_report(turn).tokens
    assert overflow(worker_api, turn)["status"] == "FAILED"
    stored = Subtask.objects.get(pk=turn["subtask_id"])
    assert (stored.error_code, stored.attempts, stored.token_cap) == ("context_overflow", 1, None)
    assert stored.error.startswith(
        f"The prompt did not fit the model's context window (attempt 1: {tokens} tokens under "
        f"no token cap). A smaller prompt cannot be built: it took {tokens} tokens, and no "
        "budget goes below 1024 tokens."
    )


def test_with_retries_off_an_overflow_fails_saying_so(api, worker_api, settings):
    settings.BATON_CONTEXT_OVERFLOW_RETRIES = 0
    big_task(api)
    [turn] = dispatch(worker_api)
    assert overflow(worker_api, turn, status="RETRY")["status"] == "FAILED"
    stored = Subtask.objects.get(pk=turn["subtask_id"])
    assert "Retrying with a tighter budget is off (BATON_CONTEXT_OVERFLOW_RETRIES=0)." in (
        stored.error
    )


def test_a_policy_cap_is_halved_from_what_the_prompt_took(api, worker_api):
    set_policy(task_type="code", values={"max_tokens": 50_000})
    big_task(api)
    [first] = dispatch(worker_api)
    row = full_report(first)
    assert row.token_budget == 50_000 > row.tokens
    overflow(worker_api, first)
    [second] = dispatch(worker_api)
    assert full_report(second).token_budget == row.tokens // 2


def test_the_turn_cap_and_the_policy_cap_the_lower_wins(api):
    big_task(api)
    set_policy(task_type="code", values={"max_tokens": 3_000})
    policy = resolve_policy(task_type="code").policy

    def budget(turn_cap: int | None) -> int | None:
        return effective_max_tokens(policy=policy, window=None, turn_cap=turn_cap).policy.max_tokens

    assert budget(None) == 3_000  # no turn cap
    assert budget(2_000) == 2_000
    assert budget(4_000) == 3_000


def test_repeating_an_overflow_report_changes_nothing(api, worker_api):
    big_task(api)
    [turn] = dispatch(worker_api)
    overflow(worker_api, turn)
    again = overflow(worker_api, turn)
    assert (again["changed"], again["status"]) == (False, "PENDING")
    stored = Subtask.objects.get(pk=turn["subtask_id"])
    assert len(stored.context_overflows) == 1


def resumed_turn(api, worker_api, task, *, message="And now?", usage=None) -> dict:
    """Complete the task's first turn in session "s1", then dispatch `message`'s turn, which
    the worker is offered to resume in that session."""
    [first] = dispatch(worker_api)
    answer = {"result": {"value": "Read it."}, "native_session_id": "s1"}
    if usage is not None:
        answer["usage"] = usage
    assert report(worker_api, first, **answer).status_code == 200
    api.post(f"/api/tasks/{task['id']}/messages/", {"message": message}, format="json")
    [resumed] = dispatch(worker_api)
    assert (resumed["resume_reason"], resumed["resume_prompt"]) == ("resume", message)
    return resumed


def resumed_overflow(worker_api, turn, **body):
    return overflow(worker_api, turn, native_session_id="s1", session_resumed=True, **body)


def test_an_overflowed_resume_is_retried_with_the_full_prompt_in_a_fresh_session(api, worker_api):
    task = big_task(api)
    resumed = resumed_turn(api, worker_api, task, usage={"input_tokens": 9_000})
    assert resumed_overflow(worker_api, resumed)["status"] == "PENDING"
    stored = Subtask.objects.get(pk=resumed["subtask_id"])
    assert stored.token_cap is None  # the resume prompt is not what overflowed: no halving
    assert stored.context_overflows == [
        {
            "attempt": 1,
            "tokens": count_tokens("And now?"),  # the resume prompt that was sent
            "max_tokens": None,
            "resumed": True,
            "session_tokens": 9_000,
        }
    ]
    assert not stored.task.native_sessions.exists()  # the overflowed session is not resumed
    sent = PromptReport.objects.filter(subtask_id=resumed["subtask_id"], attempt=1)
    assert sorted(sent.values_list("kind", "sent")) == [("full", False), ("resume", True)]

    [retry] = dispatch(worker_api)
    assert (retry["native_session"], retry["resume_prompt"], retry["resume_reason"]) == (
        None,
        None,
        "context_overflow",
    )
    # The whole conversation under the normal budget: the very prompt the resume stood for.
    assert retry["prompt"] == resumed["prompt"]
    assert retry["prompt"].startswith("## Conversation History\n\nUser:\nstep 0: compile")
    row = full_report(retry)
    assert (row.retry_reason, row.previous_token_budget, row.token_budget) == (
        "resumed_session_overflow",
        None,
        None,
    )
    assert row.tokens == full_report(resumed).tokens
    assert replay_prompt(report=row).matches
    answer = {"result": {"value": "Fresh."}, "native_session_id": "s2"}
    assert report(worker_api, retry, **answer).status_code == 200
    session = Subtask.objects.get(pk=retry["subtask_id"]).task.native_sessions.get()
    assert (session.session_id, session.turns) == ("s2", 1)


def test_a_small_conversation_whose_resumed_session_overflowed_completes_fresh(api, worker_api):
    # A few tokens of Baton's prompt in a session whose context is full: no smaller prompt
    # exists, and none is needed.
    task = create(api)
    resumed = resumed_turn(api, worker_api, task)
    assert resumed_overflow(worker_api, resumed)["status"] == "PENDING"
    [retry] = dispatch(worker_api)
    assert retry["prompt"] == resumed["prompt"]
    assert full_report(retry).retry_reason == "resumed_session_overflow"
    assert report(worker_api, retry, result={"value": "Fresh."}).status_code == 200
    assert Subtask.objects.get(pk=retry["subtask_id"]).status == "COMPLETED"


def test_a_fresh_retry_that_overflows_too_is_halved_then_fails_listing_each_attempt(
    api, worker_api, settings
):
    settings.BATON_CONTEXT_OVERFLOW_RETRIES = 1
    task = big_task(api)
    # The follow-up is long too: its full prompt can be halved twice.
    resumed = resumed_turn(api, worker_api, task, message=BUILD_LOG, usage={"input_tokens": 9_000})
    resume_tokens = PromptReport.objects.get(
        subtask_id=resumed["subtask_id"], attempt=1, kind="resume"
    ).tokens
    resumed_overflow(worker_api, resumed)
    [fresh] = dispatch(worker_api)
    fresh_tokens = full_report(fresh).tokens
    assert overflow(worker_api, fresh, native_session_id="s2")["status"] == "PENDING"
    assert Subtask.objects.get(pk=fresh["subtask_id"]).token_cap == fresh_tokens // 2
    [halved] = dispatch(worker_api)
    row = full_report(halved)
    assert (row.retry_reason, row.previous_token_budget, row.token_budget) == (
        "context_overflow",
        fresh_tokens,
        fresh_tokens // 2,
    )
    assert (halved["native_session"], halved["resume_prompt"]) == (None, None)
    overflow(worker_api, halved, error="prompt is too long")
    stored = Subtask.objects.get(pk=halved["subtask_id"])
    assert (stored.status, stored.attempts) == ("FAILED", 3)
    assert stored.error == (
        "The prompt did not fit the model's context window ("
        f"attempt 1: a {resume_tokens}-token resume prompt in a resumed native session whose "
        "last turn took 9000 input tokens; "
        f"attempt 2: {fresh_tokens} tokens under no token cap; "
        f"attempt 3: {row.tokens} tokens under a {fresh_tokens // 2}-token budget). "
        "Baton gave up after a fresh session and 1 retry with a halved budget "
        "(BATON_CONTEXT_OVERFLOW_RETRIES=1). The executor's last error: prompt is too long"
    )


def test_with_halving_off_an_overflowed_resume_still_gets_its_fresh_session(
    api, worker_api, settings
):
    settings.BATON_CONTEXT_OVERFLOW_RETRIES = 0
    task = big_task(api)
    resumed = resumed_turn(api, worker_api, task)
    assert resumed_overflow(worker_api, resumed)["status"] == "PENDING"
    [fresh] = dispatch(worker_api)
    assert overflow(worker_api, fresh)["status"] == "FAILED"
    stored = Subtask.objects.get(pk=fresh["subtask_id"])
    assert stored.error.endswith(
        "Baton retried in a fresh session; retrying with a tighter budget is off "
        "(BATON_CONTEXT_OVERFLOW_RETRIES=0). "
        "The executor's last error: Codex ran out of room in the model's context window."
    )


def test_a_resume_the_dispatch_never_offered_is_a_full_prompt_overflow(api, worker_api):
    big_task(api)
    [first] = dispatch(worker_api)
    assert first["resume_prompt"] is None
    # The worker says it resumed, but it had only the full prompt: that is what overflowed.
    overflow(worker_api, first, native_session_id="s1", session_resumed=True)
    stored = Subtask.objects.get(pk=first["subtask_id"])
    assert stored.token_cap == full_report(first).tokens // 2
    assert "resumed" not in stored.context_overflows[0]
    [second] = dispatch(worker_api)
    assert full_report(second).retry_reason == "context_overflow"


def test_a_resume_that_fell_back_to_the_full_prompt_is_halved(api, worker_api):
    task = big_task(api)
    resumed = resumed_turn(api, worker_api, task)
    # The session was not on the worker after all: it ran the full prompt, which overflowed.
    overflow(worker_api, resumed, native_session_id="s9", session_resumed=False)
    sent = PromptReport.objects.filter(subtask_id=resumed["subtask_id"], attempt=1)
    assert sorted(sent.values_list("kind", "sent")) == [("full", True), ("resume", False)]
    stored = Subtask.objects.get(pk=resumed["subtask_id"])
    assert stored.token_cap == max(full_report(resumed).tokens // 2, 1024)
    [retry] = dispatch(worker_api)
    assert (full_report(retry).retry_reason, retry["resume_prompt"]) == ("context_overflow", None)


def test_the_next_prompt_shows_no_failure_for_an_attempt_that_overflowed(api, worker_api):
    task = big_task(api)
    [first] = dispatch(worker_api)
    overflow(worker_api, first)
    [retry] = dispatch(worker_api)
    report(worker_api, retry, result={"value": "Built on the retry."})
    api.post(f"/api/tasks/{task['id']}/messages/", {"message": "Thanks."}, format="json")
    [follow_up] = dispatch(worker_api)
    history = follow_up["prompt"].split("## Current Message")[0]
    assert "Assistant:\nBuilt on the retry.\n" in history
    assert "[failed]" not in history
    assert "context window" not in history
    assert follow_up["prompt_report"]["included_message_ids"] == [1, 2]
    # The follow-up's own budget is the policy's again: the cap was the overflowed turn's.
    assert full_report(follow_up).token_budget is None
    assert full_report(follow_up).retry_reason == ""


def test_a_turn_that_failed_for_overflow_shows_what_was_tried_in_later_prompts(
    api, worker_api, settings
):
    settings.BATON_CONTEXT_OVERFLOW_RETRIES = 1
    task = big_task(api)
    for _ in range(2):
        [turn] = dispatch(worker_api)
        overflow(worker_api, turn, error="HTTP 400: maximum context length exceeded")
    api.post(f"/api/tasks/{task['id']}/messages/", {"message": "Try less."}, format="json")
    [follow_up] = dispatch(worker_api)
    history = follow_up["prompt"].split("## Current Message")[0]
    assert history.count("Assistant: [failed]\n") == 1
    failure = history.split("Assistant: [failed]\n")[1]
    assert failure.startswith("The prompt did not fit the model's context window (attempt 1: ")
    assert "Baton gave up after 1 retry with a halved budget" in failure


def test_the_tightened_prompt_replays_byte_for_byte(api, worker_api):
    big_task(api)
    [first] = dispatch(worker_api)
    overflow(worker_api, first)
    [second] = dispatch(worker_api)
    replay = replay_prompt(report=full_report(second))
    assert replay.matches, replay.problem
    assert replay.text == second["prompt"] != first["prompt"]


def test_a_tightened_turn_whose_prompt_cannot_be_built_fails_clearly(api, worker_api):
    big_task(api)
    [first] = dispatch(worker_api)
    overflow(worker_api, first)
    # Below what any policy allows (1024): the structure alone does not fit, whatever is cut.
    Subtask.objects.filter(pk=first["subtask_id"]).update(token_cap=5)
    assert dispatch(worker_api) == []
    stored = Subtask.objects.get(pk=first["subtask_id"])
    assert (stored.status, stored.error_code) == ("FAILED", "context_overflow")
    assert stored.error.startswith("The prompt did not fit the model's context window (attempt 1:")
    assert stored.error.endswith(
        "A smaller prompt cannot be built: its fixed sections alone exceed the 5-token budget."
    )
