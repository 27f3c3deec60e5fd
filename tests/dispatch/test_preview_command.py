"""`manage.py preview_prompt`: the preview page's prompt, report and budget bar in a terminal."""

from __future__ import annotations

from io import StringIO

import pytest
from django.core.management import CommandError, call_command

from backend.dispatch.management.commands.preview_prompt import budget_bar
from backend.dispatch.preview import BudgetSegment
from backend.dispatch.prompts import next_turn_to_dispatch
from backend.prompting import Role
from backend.tasks.models import Bot
from tests.dispatch.test_admin import SMALL_TASK_PROMPT, converse, data_snapshot, long_task

pytestmark = pytest.mark.django_db


def preview(*args: str) -> str:
    out = StringIO()
    call_command("preview_prompt", *args, stdout=out)
    return out.getvalue()


def test_prints_the_prompt_then_the_report_then_the_bar(user):
    # A bot whose model is not known: no token budget, so the bar shows the sections alone.
    Bot.objects.update(model="")
    task = converse(owner=user, exchanges=[("What is 2+2?", "4")], follow_up="And 3+3?")
    subtask = next_turn_to_dispatch(task=task)
    before = data_snapshot()
    output = preview(str(subtask.pk))
    assert output.startswith("=== Prompt ===\n" + SMALL_TASK_PROMPT + "\n=== Report ===\n")
    report = output.split("=== Report ===\n", 1)[1]
    assert (
        f"\nturn: task {task.pk} message 4 (subtask {subtask.pk}, PENDING), in reply to message 3\n"
        in report
    )
    assert "policy: code v1" in report
    assert "messages: 2 considered, 2 included, 0 omitted (0 user, 0 assistant)" in report
    assert "truncated: none" in report
    assert "history turns: 1 User included, 2 Assistant included" in report
    bar = report.split("=== Token budget ===\n", 1)[1].splitlines()[0]
    assert bar.startswith("[H") and bar.endswith("C]")
    assert len(bar) == 62 and set(bar[1:-1]) == {"H", "C"}
    assert data_snapshot() == before


def test_policy_json_overrides_the_resolved_policy(user):
    task = long_task(owner=user, rounds=4)
    subtask = next_turn_to_dispatch(task=task)
    before = data_snapshot()
    output = preview(str(subtask.pk), "--policy-json", '{"max_messages": 3, "max_tokens": 4096}')
    prompt = output.split("=== Report ===", 1)[0]
    assert "[omitted earlier messages: 5 (2 user, 3 assistant)]" in prompt
    assert prompt.count("User:\n") == 3
    assert "policy: unsaved edit (based on code v1)" in output
    assert "of max 4096" in output
    bar = output.split("=== Token budget ===\n", 1)[1].splitlines()[0]
    assert bar.endswith(".]")  # the unused part of max_tokens
    assert "1 User included, 2 Assistant omitted" in output
    assert data_snapshot() == before


def test_the_kill_switch_applies_to_the_preview(user, settings):
    settings.EXECUTOR_HISTORY_ENABLED = False
    task = converse(owner=user, exchanges=[("What is 2+2?", "4")], follow_up="And 3+3?")
    output = preview(str(next_turn_to_dispatch(task=task).pk), "--policy-json", '{"enabled": true}')
    assert output.startswith("=== Prompt ===\nAnd 3+3?\n=== Report ===")
    assert "kill switch: EXECUTOR_HISTORY_ENABLED is false" in output
    assert "history turns: 1 User history off, 2 Assistant history off" in output


@pytest.mark.parametrize(
    ("policy_json", "fragment"),
    [
        ("{max_messages: 3}", "not valid JSON"),
        ("[3]", "must be a JSON object"),
        ('{"max_messages": 0}', "max_messages: must be a positive integer"),
        ('{"max_tokens": 12}', "max_tokens: must be at least 1024"),
        ('{"max_mesages": 3}', "max_mesages: not a policy field"),
        ('{"per_message_max_chars": 90000}', "per_message_max_chars must not exceed max_chars"),
        ('{"context_passing": "everything"}', "context_passing"),
    ],
)
def test_invalid_policy_json_names_the_problem(user, policy_json, fragment):
    task = converse(owner=user, exchanges=[("Hi", "Hello")], follow_up="Bye")
    subtask = next_turn_to_dispatch(task=task)
    with pytest.raises(CommandError, match=fragment):
        preview(str(subtask.pk), "--policy-json", policy_json)


def test_unknown_and_user_turns_are_refused(user):
    task = converse(owner=user, exchanges=[("Hi", "Hello")], follow_up="Bye")
    with pytest.raises(CommandError, match="No subtask 999999"):
        preview("999999")
    user_turn = task.subtasks.get(message_id=1)
    assert user_turn.role == Role.USER
    with pytest.raises(CommandError, match="not an ASSISTANT turn"):
        preview(str(user_turn.pk))


def test_a_finished_turn_previews_what_a_rerun_would_send(user):
    task = converse(owner=user, exchanges=[("What is 2+2?", "4")], follow_up="And 3+3?")
    answered = task.subtasks.get(message_id=2)
    output = preview(str(answered.pk))
    assert output.startswith("=== Prompt ===\nWhat is 2+2?\n=== Report ===")
    assert (
        f"\nturn: task {task.pk} message 2 (subtask {answered.pk}, COMPLETED), "
        "in reply to message 1\n"
    ) in output


@pytest.mark.parametrize(
    "shares",
    [(1.0,), (0.5, 0.5), (0.333, 0.333, 0.334), (0.01, 0.98, 0.01), (0.2, 0.05, 0.05, 0.7)],
)
def test_budget_bar_fills_its_width_exactly(shares):
    names = ["history", "current", "previous_result", "unused"]
    segments = tuple(
        BudgetSegment(name=name, label=name, tokens=1, share=share)
        for name, share in zip(names, shares, strict=False)
    )
    bar = budget_bar(segments, width=60)
    assert len(bar) == 62
    for segment, char in zip(segments, "HCP.", strict=False):
        assert abs(bar.count(char) - segment.share * 60) < 1
    assert budget_bar((), width=60) == "[]"
