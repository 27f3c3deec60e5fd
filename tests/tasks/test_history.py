"""The history window: rows → prompt input → the prompt an executor receives."""

from __future__ import annotations

import pytest

from backend.prompting import PromptPolicy, Role, build_prompt, parse_prompt
from backend.tasks.factories import answer_pending, conversation
from backend.tasks.history import prompt_input_for, prompt_inputs_for, selection
from backend.tasks.models import Subtask, SubtaskStatus, Task
from backend.tasks.services import PipelineStep, append_message, record_result

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("pipeline_bots")]


def chat(user, rounds: int, *, pipeline=None, is_group_chat=False, answer=None) -> Task:
    """A task with `rounds` answered rounds and one more pending user message."""
    pipeline = pipeline or [PipelineStep(executor="agno")]
    # Each step answers in its own name: the default bot of an executor is named after it.
    bots = [step.bot or step.executor for step in pipeline]
    return conversation(
        owner=user,
        title="chat",
        task_type="chat",
        messages=[f"question {number}" for number in range(1, rounds + 2)],
        answers=[
            answer(number) if answer else tuple(f"answer {number} from {bot}" for bot in bots)
            for number in range(1, rounds + 1)
        ],
        pipeline=pipeline,
        sender="alice" if is_group_chat else "",
        is_group_chat=is_group_chat,
    )


def pending(task: Task) -> list[Subtask]:
    return list(
        task.subtasks.filter(role=Role.ASSISTANT, status=SubtaskStatus.PENDING).order_by(
            "message_id"
        )
    )


def prompt_for(task: Task, policy: PromptPolicy, turn: Subtask | None = None):
    turn = turn or pending(task)[0]
    return build_prompt(prompt_input_for(subtask=turn, task=task, policy=policy), policy)


def test_first_turn_is_the_user_text_verbatim(user):
    task = chat(user, 0)
    build = prompt_for(task, PromptPolicy())
    assert build.text == "question 1"


def test_follow_up_sees_the_conversation(user):
    task = chat(user, 2)
    build = prompt_for(task, PromptPolicy())
    assert build.text == (
        "## Conversation History\n\n"
        "User:\nquestion 1\n\n"
        "Assistant:\nanswer 1 from agno\n\n"
        "User:\nquestion 2\n\n"
        "Assistant:\nanswer 2 from agno\n\n"
        "## Current Message\n\n"
        "User:\nquestion 3\n"
    )
    assert build.report.messages_included == 4


def test_window_keeps_the_first_user_message_and_counts_the_rest(user):
    task = chat(user, 6)  # 12 history turns before "question 7"
    policy = PromptPolicy(max_messages=3)
    build = prompt_for(task, policy)
    parsed = parse_prompt(build.text)
    assert build.report.first_user_message_pinned
    history = build.text.split("## Current Message")[0]
    assert "User:\nquestion 1\n" in history
    assert "answer 6 from agno" in history
    # The pinned message counts against max_messages: q1 + the two newest turns.
    assert "[omitted earlier messages: 9 (4 user, 5 assistant)]" in history
    assert build.report.included_message_ids == (1, 11, 12)
    assert [m.content for m in parsed.sections[0].messages] == [
        "question 1",
        "question 6",
        "answer 6 from agno",
    ]


def test_window_without_pinning(user):
    task = chat(user, 4)
    build = prompt_for(task, PromptPolicy(max_messages=2, keep_first_user_message=False))
    assert "question 1\n" not in build.text
    assert "[omitted earlier messages: 6 (3 user, 3 assistant)]" in build.text


def test_unlimited_message_count_reads_only_what_fits(user):
    task = chat(user, 30, answer=lambda n: f"answer {n} " + "x" * 300)
    policy = PromptPolicy(max_messages=None, max_chars=2_000, per_message_max_chars=1_000)
    build = prompt_for(task, policy)
    assert build.report.chars < 2_600
    assert "answer 30 " in build.text
    assert build.report.messages_omitted > 20


def test_disabled_history_is_the_current_message_only(user):
    task = chat(user, 3)
    build = prompt_for(task, PromptPolicy(enabled=False))
    assert build.text == "question 4"


def test_group_chat_labels_senders(user):
    task = chat(user, 1, is_group_chat=True)
    build = prompt_for(task, PromptPolicy())
    assert "User[alice]:\nquestion 1" in build.text
    assert "User[alice]:\nquestion 2" in build.text


def test_pipeline_step_sees_the_previous_result(user):
    steps = [
        PipelineStep(bot="coder", executor="codex"),
        PipelineStep(bot="reviewer", executor="claude_code"),
    ]
    task = chat(user, 1, pipeline=steps)
    coder, reviewer = pending(task)
    record_result(subtask=coder, status=SubtaskStatus.COMPLETED, result={"value": "patch v2"})
    build = prompt_for(task, PromptPolicy(), turn=Subtask.objects.get(pk=reviewer.pk))
    assert "Assistant[coder]:\nanswer 1 from coder" in build.text
    assert "Assistant[reviewer]:\nanswer 1 from reviewer" in build.text
    assert build.text.endswith("## Previous Result\n\nAssistant[coder]:\npatch v2\n")


def test_spilled_result_renders_preview_and_pointer(user, settings):
    settings.BATON_SPILL_THRESHOLD_CHARS = 1_000
    settings.BATON_PREVIEW_HEAD_CHARS = settings.BATON_PREVIEW_TAIL_CHARS = 20
    task = chat(user, 1, answer=lambda n: "$ make\n" + "compiling...\n" * 200)
    build = prompt_for(task, PromptPolicy())
    artifact = task.subtasks.get(message_id=2).artifact
    assert (
        f"[artifact {artifact.id} · command_output · 2,607 chars, 201 lines · "
        f"full text: .baton/artifacts/{artifact.id}.txt]"
    ) in build.text
    assert "…2567 chars truncated…" in build.text
    assert build.report.artifacts == (artifact.id,)


def test_failed_turn_is_marked(user):
    task = chat(user, 0)
    record_result(subtask=pending(task)[0], status=SubtaskStatus.FAILED, error="tool crashed")
    append_message(task=task, message="try again")
    build = prompt_for(task, PromptPolicy())
    assert "Assistant: [failed]\ntool crashed" in build.text


# Message cap; character cap without a message cap (with and without a per-message cap); no cap.
POLICIES = {
    "messages": PromptPolicy(max_messages=4),
    "chars": PromptPolicy(max_messages=None, max_chars=700, per_message_max_chars=200),
    "chars_uncapped": PromptPolicy(max_messages=None, max_chars=700, per_message_max_chars=None),
    "none": PromptPolicy(max_messages=None, max_chars=None, per_message_max_chars=None),
}


def _queries_per_read(is_postgres: bool) -> int:
    """PostgreSQL reads a batch's rows in one statement (`history_selection`); SQLite runs the
    ORM's three queries: the window ids ranked with the totals, the window rows, the anchors."""
    return 1 if is_postgres else 3


@pytest.mark.parametrize("rounds", [3, 40])
@pytest.mark.parametrize("policy", POLICIES.values(), ids=POLICIES.keys())
def test_query_count_is_constant(user, django_assert_num_queries, is_postgres, rounds, policy):
    task = chat(user, rounds)
    turn = pending(task)[0]
    with django_assert_num_queries(_queries_per_read(is_postgres)):
        prompt_input_for(subtask=turn, task=task, policy=policy)


def test_a_batch_costs_the_same_queries_whatever_its_size_and_policies(
    user, django_assert_num_queries, is_postgres
):
    tasks = [chat(user, rounds) for rounds in (1, 6, 12, 25)]
    requests = [
        (pending(task)[0], task, policy)
        for task, policy in zip(tasks, POLICIES.values(), strict=True)
    ]
    with django_assert_num_queries(_queries_per_read(is_postgres)):
        batched = prompt_inputs_for(requests=requests)
    for subtask, task, policy in requests:
        assert batched[subtask.pk] == prompt_input_for(subtask=subtask, task=task, policy=policy)


def test_a_batch_under_message_caps_reads_each_window(user, django_assert_num_queries, is_postgres):
    """Every policy caps messages (the shipped policies' case): each window is that task's
    newest `max_messages` history turns, with its pinned first message and its totals."""
    caps = {1: 4, 6: 2, 12: 5, 25: 3}
    tasks = {rounds: chat(user, rounds) for rounds in caps}
    requests = [
        (pending(task)[0], task, PromptPolicy(max_messages=caps[rounds]))
        for rounds, task in tasks.items()
    ]
    with django_assert_num_queries(_queries_per_read(is_postgres)):
        batched = prompt_inputs_for(requests=requests)
    for subtask, task, policy in requests:
        loaded = batched[subtask.pk]
        history = list(
            task.subtasks.filter(message_id__lt=subtask.parent_message_id)
            .order_by("message_id")
            .values_list("message_id", "history_text")
        )
        newest = history[-policy.max_messages :]
        if newest[0][0] != 1:
            newest = [history[0], *newest]  # the first user message stays pinned
        assert [(item.message_id, item.text) for item in loaded.history] == newest
        assert loaded.current.message_id == subtask.parent_message_id
        current = task.subtasks.get(message_id=subtask.parent_message_id)
        assert loaded.current.text == current.message
        assert loaded.earlier_user_messages + loaded.earlier_assistant_messages == len(
            history
        ) - len(newest)


def test_window_turns_are_read_without_their_messages(user):
    """A window turn's message (the whole text a user sent, which can be long) is not read with
    it: its history text is what a prompt shows. The anchors' messages are read."""
    task = chat(user, 5)
    turn = pending(task)[0]
    read = selection.select_turns(
        [selection.HistoryRequest(turn, task, PromptPolicy(max_messages=3))]
    )
    assert [row.message_id for row in read.window] == [10, 9, 8]
    assert all("message" in row.get_deferred_fields() for row in read.window)
    assert sorted((row.message_id, row.message) for row in read.anchors) == [
        (1, "question 1"),
        (turn.parent_message_id, "question 6"),
    ]
    assert read.totals == {task.pk: (5, 5)}


@pytest.mark.parametrize("per_message_max_chars", [None, 150, 400])
def test_a_character_budget_loads_the_turns_whose_newer_turns_fit(user, per_message_max_chars):
    """Without a message cap, the window is the newest turns up to and including the first
    one that overflows `max_chars` (each counted at most `per_message_max_chars`): nothing
    older can make the prompt."""
    task = chat(user, 20, answer=lambda n: f"answer {n} " + "x" * (37 * n % 500))
    policy = PromptPolicy(
        max_messages=None,
        max_chars=1_500,
        per_message_max_chars=per_message_max_chars,
        keep_first_user_message=False,
    )
    turn = pending(task)[0]
    expected, used = [], 0
    for message_id, text in (
        task.subtasks.filter(message_id__lt=turn.parent_message_id)
        .order_by("-message_id")
        .values_list("message_id", "history_text")
    ):
        expected.append(message_id)
        used += min(len(text), per_message_max_chars or len(text))
        if used > policy.max_chars:
            break
    loaded = prompt_input_for(subtask=turn, task=task, policy=policy)
    assert [message.message_id for message in loaded.history] == sorted(expected)
    assert 1 < len(expected) < 40
    assert loaded.earlier_user_messages + loaded.earlier_assistant_messages == 40 - len(expected)


def test_a_step_that_never_ran_shows_why_in_history(user):
    """After step 0 fails, step 1 is failed unrun; the next prompt says so rather than nothing."""
    steps = [
        PipelineStep(bot="coder", executor="codex"),
        PipelineStep(bot="reviewer", executor="claude_code"),
    ]
    task = chat(user, 0, pipeline=steps)
    coder, _reviewer = pending(task)
    record_result(subtask=coder, status=SubtaskStatus.FAILED, error="compiler crashed")
    append_message(task=task, message="try again")
    build = prompt_for(task, PromptPolicy())
    assert (
        "Assistant[coder]: [failed]\ncompiler crashed\n\n"
        "Assistant[reviewer]: [failed]\nNot run: pipeline step 0 (coder) failed.\n\n"
    ) in build.text


def test_a_spilled_previous_result_points_to_its_whole_text(user, settings):
    """A pipeline's reviewer can fetch the coder's whole answer: pointer, report and manifest."""
    settings.BATON_SPILL_THRESHOLD_CHARS = 1_000
    settings.BATON_PREVIEW_HEAD_CHARS = settings.BATON_PREVIEW_TAIL_CHARS = 20
    steps = [
        PipelineStep(bot="coder", executor="codex"),
        PipelineStep(bot="reviewer", executor="claude_code"),
    ]
    task = chat(user, 0, pipeline=steps)
    coder, reviewer = pending(task)
    answer = "diff --git a/x b/x\n" + "+added line\n" * 500
    record_result(subtask=coder, status=SubtaskStatus.COMPLETED, result={"value": answer})
    artifact = Subtask.objects.get(pk=coder.pk).artifact
    build = prompt_for(task, PromptPolicy(), turn=Subtask.objects.get(pk=reviewer.pk))
    assert build.text.endswith(
        f"[artifact {artifact.id} · {artifact.kind} · {len(answer):,} chars, 501 lines · "
        f"full text: .baton/artifacts/{artifact.id}.txt]\n"
    )
    assert build.report.artifacts == (artifact.id,)
    assert build.report.previous_result_truncated
    # A diff's preview is cut on line boundaries: the head ends after the diff header's line.
    assert "\nAssistant[coder]:\ndiff --git a/x b/x\n…" in build.text
    assert build.report.previous_result_removed_chars == len(answer) - 39


def test_a_cut_current_message_points_to_its_whole_text(user, settings):
    settings.BATON_SPILL_THRESHOLD_CHARS = 1_000
    message = "Please review this log:\n" + "line of the log\n" * 200
    task = chat(user, 1)
    answer_pending(task=task, answer="ok")
    append_message(task=task, message=message)
    artifact = task.subtasks.get(role=Role.USER, message=message).artifact
    build = prompt_for(task, PromptPolicy(current_message_max_chars=100))
    assert build.text.endswith(
        f"[artifact {artifact.id} · {artifact.kind} · {len(message):,} chars, 201 lines · "
        f"full text: .baton/artifacts/{artifact.id}.txt]\n"
    )
    assert build.report.current_truncated
    assert artifact.id in build.report.artifacts
