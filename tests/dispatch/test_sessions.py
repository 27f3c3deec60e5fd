"""Native sessions: what a session has seen, the resume prompt, affinity and fallback."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from backend.dispatch.models import HistoryPolicy, PromptReport
from backend.tasks.models import Bot, NativeSession, Subtask
from tests.dispatch.steering import settle, steer
from tests.dispatch.test_dispatch_api import PIPELINE, SINGLE, create, dispatch, report

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("pipeline_bots")]


def follow_up(api, task, message, **extra):
    response = api.post(
        f"/api/tasks/{task['id']}/messages/", {"message": message, **extra}, format="json"
    )
    assert response.status_code == 201, response.json()


def answer(client, turn, text, *, session="s1", resumed=False, worker_id="w1", **extra):
    response = report(
        client,
        turn,
        worker_id=worker_id,
        result={"value": text},
        native_session_id=session,
        session_resumed=resumed,
        **extra,
    )
    assert response.status_code == 200, response.json()


def _statements(client, turn, text, **extra) -> list[str]:
    with CaptureQueriesContext(connection) as queries:
        answer(client, turn, text, **extra)
    return [query["sql"] for query in queries.captured_queries]


def test_a_session_costs_a_report_two_statements_its_read_and_its_write(api, worker_api):
    tasks = [create(api) for _ in range(3)]
    warm_up, plain, fresh = dispatch(worker_api, limit=3)
    answer(worker_api, warm_up, "The token is looked up once.", session="")
    without = _statements(worker_api, plain, "No session.", session="")
    started = _statements(worker_api, fresh, "A session starts.")
    # On PostgreSQL the prompt reports' update returns what the prompt sent held: no read of
    # its own. SQLite runs the ORM's update, then its read.
    reads = sum(
        statement.startswith("SELECT") and PromptReport._meta.db_table in statement
        for statement in started
    )
    assert reads == (0 if connection.vendor == "postgresql" else 1)
    assert len(started) == len(without) + 2 + reads, [s[:80] for s in started]
    session = NativeSession.objects.get(task_id=tasks[2]["id"])
    assert (session.session_id, session.seen_message_ids, session.turns) == ("s1", [1, 2], 1)
    follow_up(api, tasks[2], "Second question.")
    [resumed] = dispatch(worker_api)
    assert resumed["resume_reason"] == "resume"
    again = _statements(worker_api, resumed, "Resumed.", resumed=True)
    assert len(again) == len(without) + 2 + reads
    session.refresh_from_db()
    assert (session.seen_message_ids, session.turns, session.context_tokens) == (
        [1, 2, 3, 4],
        2,
        None,
    )
    assert session.updated_at > session.created_at


def test_a_resumed_session_gets_only_what_it_has_not_seen(api, worker_api):
    task = create(api)
    [first] = dispatch(worker_api)
    assert (first["native_session"], first["resume_prompt"], first["resume_reason"]) == (
        None,
        None,
        "no_session",
    )
    answer(worker_api, first, "First answer.", usage={"input_tokens": 500})
    session = NativeSession.objects.get(task_id=task["id"])
    assert (session.session_id, session.worker_id, session.seen_through_message_id) == (
        "s1",
        "w1",
        2,
    )
    assert (session.seen_message_ids, session.context_tokens) == ([1, 2], 500)

    follow_up(api, task, "Second question.")
    [second] = dispatch(worker_api)
    assert second["native_session"] == {
        "id": "s1",
        "worker_id": "w1",
        "seen_through_message_id": 2,
    }
    assert second["resume_reason"] == "resume"
    # The full prompt carries the history; the resume prompt only the new message.
    assert second["prompt"].startswith("## Conversation History\n\nUser:\nCI is red.")
    assert second["resume_prompt"] == "Second question."
    assert second["resume_prompt_report"]["included_message_ids"] == []
    assert second["prompt_report"]["included_message_ids"] == [1, 2]
    answer(worker_api, second, "Second answer.", resumed=True)
    session.refresh_from_db()
    assert (session.seen_through_message_id, session.seen_message_ids, session.turns) == (
        4,
        [1, 2, 3, 4],
        2,
    )
    reports = PromptReport.objects.filter(subtask_id=second["subtask_id"])
    assert sorted(reports.values_list("kind", "sent", "resume_reason")) == [
        ("full", False, "resume"),
        ("resume", True, "resumed"),
    ]


def test_other_members_and_other_bots_reach_the_resumed_session(api, worker_api):
    body = {**PIPELINE, "is_group_chat": True, "sender": "alice", "message": "Add retries."}
    task = create(api, body)
    kinds = ["codex", "claude_code"]
    [coder] = dispatch(worker_api, kinds=kinds)
    answer(worker_api, coder, "Patched.", session="coder-1")
    [reviewer] = dispatch(worker_api, kinds=kinds)
    answer(worker_api, reviewer, "Add a test too.", session="reviewer-1")
    follow_up(api, task, "Agreed, add the test.", sender="bob")
    [coder] = dispatch(worker_api, kinds=kinds)
    assert coder["resume_prompt"] == (
        "## Conversation History\n\n"
        "Assistant[reviewer]:\nAdd a test too.\n\n"
        "## Current Message\n\n"
        "User[bob]:\nAgreed, add the test.\n"
    )
    answer(worker_api, coder, "Test added.", session="coder-1", resumed=True)
    [reviewer] = dispatch(worker_api, kinds=kinds)
    # The reviewer's session saw the first round; what is new to it is bob's message and the
    # coder's new answer (which comes as the Previous Result, not twice).
    assert reviewer["resume_prompt"] == (
        "## Current Message\n\n"
        "User[bob]:\nAgreed, add the test.\n\n"
        "## Previous Result\n\n"
        "Assistant[coder]:\nTest added.\n"
    )
    assert "Add a test too." not in reviewer["resume_prompt"]
    assert "Patched." not in reviewer["resume_prompt"]


def test_a_turn_waits_for_its_sessions_worker_then_anyone_runs_it_fresh(
    api, worker_api, other_worker_api, settings
):
    settings.BATON_SESSION_AFFINITY_SECONDS = 30
    task = create(api)
    [first] = dispatch(worker_api)
    answer(worker_api, first, "First answer.")
    follow_up(api, task, "Second question.")
    turn = Subtask.objects.get(task_id=task["id"], message_id=4)
    assert turn.session_worker == "w1"
    # Another worker is held off while the session's worker may still come.
    idle = other_worker_api.post(
        "/api/executor/dispatch/", {"kinds": ["codex"], "worker_id": "w2"}, format="json"
    ).json()
    assert idle["turns"] == []
    assert 25 < idle["next_ready_in_seconds"] <= 30
    # Once the grace period is over, any worker takes it, with the full prompt only.
    Subtask.objects.filter(pk=turn.pk).update(pending_since=timezone.now() - timedelta(seconds=31))
    [taken] = dispatch(other_worker_api, worker_id="w2")
    assert (taken["native_session"], taken["resume_prompt"], taken["resume_reason"]) == (
        None,
        None,
        "other_worker",
    )
    assert "First answer." in taken["prompt"]


def test_a_failed_resume_replaces_the_session_and_says_so(api, worker_api):
    task = create(api)
    [first] = dispatch(worker_api)
    answer(worker_api, first, "First answer.")
    follow_up(api, task, "Second question.")
    [second] = dispatch(worker_api)
    assert second["resume_prompt"] == "Second question."
    # The worker could not resume s1 and ran the full prompt in a new session s2.
    answer(worker_api, second, "Second answer.", session="s2", resumed=False)
    session = NativeSession.objects.get(task_id=task["id"])
    assert (session.session_id, session.seen_through_message_id, session.turns) == ("s2", 4, 1)
    assert session.seen_message_ids == [1, 2, 3, 4]
    reports = PromptReport.objects.filter(subtask_id=second["subtask_id"])
    assert sorted(reports.values_list("kind", "sent", "resume_reason")) == [
        ("full", True, "resume"),
        ("resume", False, "resume_failed"),
    ]
    assert Subtask.objects.get(pk=second["subtask_id"]).native_session_id == "s2"


@pytest.mark.parametrize(
    ("setup", "reason"),
    [
        ("policy_off", "policy_off"),
        ("history_off", "history_disabled"),
        ("context_full", "context_full"),
        ("agno", "executor_keeps_baton_prompt"),
    ],
)
def test_when_a_session_starts_fresh_anyway(api, worker_api, settings, setup, reason):
    kind = "agno" if setup == "agno" else "codex"
    task = create(api, {**SINGLE, "executor": kind})
    [first] = dispatch(worker_api, kinds=[kind])
    answer(worker_api, first, "First answer.", usage={"input_tokens": 900})
    if setup == "policy_off":
        HistoryPolicy.objects.filter(task_type="code").update(
            resume_native_sessions=False, overrides=["resume_native_sessions"]
        )
    if setup == "history_off":
        settings.EXECUTOR_HISTORY_ENABLED = False
    if setup == "context_full":
        Bot.objects.filter(name="codex").update(context_window=1_000)  # 900 > 0.8 × 1,000
    follow_up(api, task, "Second question.")
    [second] = dispatch(worker_api, kinds=[kind])
    assert (second["native_session"], second["resume_prompt"], second["resume_reason"]) == (
        None,
        None,
        reason,
    )
    assert PromptReport.objects.filter(subtask_id=second["subtask_id"]).count() == 1


def test_unseen_turns_outside_the_window_mean_a_fresh_session(api, worker_api):
    HistoryPolicy.objects.filter(task_type="code").update(
        max_messages=4, overrides=["max_messages"]
    )
    task = create(api)
    for number in range(5):
        [turn] = dispatch(worker_api)
        answer(worker_api, turn, f"Answer {number}.", resumed=number > 0)
        follow_up(api, task, f"Question {number}.")
    # As if the session had missed turns (another bot answered them, say).
    NativeSession.objects.filter(task_id=task["id"]).update(seen_through_message_id=2)
    [turn] = dispatch(worker_api)
    assert turn["resume_reason"] == "unseen_beyond_window"
    assert turn["resume_prompt"] is None


def test_the_admin_preview_shows_both_prompts_for_a_turn_with_a_live_session(
    api, worker_api, admin_client
):
    task = create(api)
    [first] = dispatch(worker_api)
    answer(worker_api, first, "First answer.")
    follow_up(api, task, "Second <question>.")
    page = admin_client.get("/admin/dispatch/historypolicy/preview/", {"task": task["id"]})
    assert page.status_code == 200
    text = page.content.decode()
    assert "codex session s1 on worker w1" in text.replace("OpenAI Codex CLI", "codex")
    assert '<pre id="resume-prompt-text">\nSecond &lt;question&gt;.</pre>' in text
    assert "First answer." in text  # the full prompt, for any other worker
    # Reports of dispatched turns say which prompt went out, and why.
    [second] = dispatch(worker_api)
    answer(worker_api, second, "Second answer.", resumed=True)
    listing = admin_client.get("/admin/dispatch/promptreport/").content.decode()
    assert "resumed" in listing


def test_the_preview_says_why_no_resume_would_be_offered(api, worker_api, admin_client):
    task = create(api)
    [first] = dispatch(worker_api)
    answer(worker_api, first, "First answer.")
    HistoryPolicy.objects.filter(task_type="code").update(
        resume_native_sessions=False, overrides=["resume_native_sessions"]
    )
    follow_up(api, task, "Second question.")
    page = admin_client.get(
        "/admin/dispatch/historypolicy/preview/", {"task": task["id"]}
    ).content.decode()
    assert "in a fresh session (policy_off)" in page
    assert '<pre id="resume-prompt-text">' not in page


def test_a_session_that_received_a_steer_is_not_given_it_again(api, worker_api):
    task = create(api)
    [turn] = dispatch(worker_api)
    given = steer(api, task, "Also cover the Windows path.")
    settle(worker_api, turn, given["steer_id"])
    answer(worker_api, turn, "Fixed, Windows path included.")
    session = NativeSession.objects.get(task_id=task["id"])
    assert (session.seen_through_message_id, session.seen_message_ids) == (2, [1, 2, 3])
    follow_up(api, task, "Thanks, now the docs.")
    [turn] = dispatch(worker_api)
    assert (
        "Assistant:\nFixed, Windows path included.\n\n"
        "User: [sent while Assistant was answering]\nAlso cover the Windows path.\n\n"
    ) in turn["prompt"]
    # Only the new message: a resume prompt of the current message alone is its text.
    assert turn["resume_prompt"] == "Thanks, now the docs."


def test_a_session_whose_steer_fell_back_is_given_it(api, worker_api):
    task = create(api)
    [turn] = dispatch(worker_api)
    given = steer(api, task, "Also cover the Windows path.")
    settle(worker_api, turn, given["steer_id"], refusal="finished")
    answer(worker_api, turn, "Fixed.")
    session = NativeSession.objects.get(task_id=task["id"])
    assert session.seen_message_ids == [1, 2]
    # The steer's own round answers it: the session is told it as the current message.
    [turn] = dispatch(worker_api)
    assert turn["resume_prompt"] == "Also cover the Windows path."
    assert "Also cover the Windows path." not in turn["prompt"].split("## Current Message")[0]


def test_a_resume_leaves_out_a_received_steer_but_not_a_later_message(api, worker_api):
    task = create(api)
    [turn] = dispatch(worker_api)
    settle(worker_api, turn, steer(api, task, "And the docs.")["steer_id"])
    answer(worker_api, turn, "Fixed, docs too.")
    follow_up(api, task, "Ship it.")
    [second] = dispatch(worker_api)
    answer(worker_api, second, "Shipped.", session="")  # ran without the session
    follow_up(api, task, "Now the changelog.")
    [third] = dispatch(worker_api)
    assert third["resume_prompt"] == (
        "## Conversation History\n\nUser:\nShip it.\n\nAssistant:\nShipped.\n\n"
        "## Current Message\n\nUser:\nNow the changelog.\n"
    )
