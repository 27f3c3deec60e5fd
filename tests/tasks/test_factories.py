"""The task factories leave what a real conversation leaves: ids, states, senders and results."""

from __future__ import annotations

import pytest

from backend.tasks.factories import answer_pending, answered_task, conversation
from backend.tasks.models import SubtaskStatus, Task, TaskStatus
from backend.tasks.services import PipelineStep

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("pipeline_bots")]

TWO_STEPS = [PipelineStep(bot="coder"), PipelineStep(bot="reviewer")]
FIELDS = ("message_id", "parent_message_id", "role", "status", "sender", "bot", "history_text")


def turns(task: Task) -> list[tuple]:
    return list(task.subtasks.order_by("message_id").values_list(*FIELDS))


def test_answered_task_has_its_message_answered_by_the_default_bot(user):
    task = answered_task(owner=user, message="Run the tests.", answer="All green.")
    assert (task.title, task.task_type) == ("Answered task", "code")
    assert turns(task) == [
        (1, None, "USER", "COMPLETED", "", "", "Run the tests."),
        (2, 1, "ASSISTANT", "COMPLETED", "", "codex", "All green."),
    ]
    task.refresh_from_db()
    assert task.status == TaskStatus.COMPLETED


def test_each_step_of_a_pipeline_gets_its_own_answer(user):
    task = answered_task(
        owner=user, message="Fix it.", answer=("Patched.", "Looks right."), pipeline=TWO_STEPS
    )
    assert turns(task)[1:] == [
        (2, 1, "ASSISTANT", "COMPLETED", "", "coder", "Patched."),
        (3, 1, "ASSISTANT", "COMPLETED", "", "reviewer", "Looks right."),
    ]
    result = task.subtasks.get(message_id=3).result
    assert result == {"value": "Looks right."}


def test_a_conversation_leaves_its_last_message_pending(user):
    task = conversation(
        owner=user,
        messages=["Hi", "Next?", "Last?"],
        answers=["Hello", "Sure"],
        task_type="chat",
        pipeline=PipelineStep(executor="agno"),
        sender="alice",
        is_group_chat=True,
    )
    assert turns(task) == [
        (1, None, "USER", "COMPLETED", "alice", "", "Hi"),
        (2, 1, "ASSISTANT", "COMPLETED", "", "agno", "Hello"),
        (3, None, "USER", "COMPLETED", "alice", "", "Next?"),
        (4, 3, "ASSISTANT", "COMPLETED", "", "agno", "Sure"),
        (5, None, "USER", "COMPLETED", "alice", "", "Last?"),
        (6, 5, "ASSISTANT", "PENDING", "", "agno", ""),
    ]
    [answered] = answer_pending(task=task, answer="Done.")
    assert (answered.message_id, answered.status) == (6, SubtaskStatus.COMPLETED)


def test_long_answers_are_ingested_as_the_service_does(user, settings):
    settings.BATON_SPILL_THRESHOLD_CHARS = 1_000
    task = answered_task(owner=user, answer="x" * 5_000)
    turn = task.subtasks.get(message_id=2)
    assert turn.artifact is not None
    assert turn.result == {"value": None}


@pytest.mark.parametrize(
    ("messages", "answers", "error"),
    [
        ([], [], "starts with a message"),
        (["one"], ["a", "b"], "more answers than the 1 messages"),
        (["one", "two", "three"], ["a"], "message 2 of 3 has no answer"),
    ],
)
def test_answers_must_pair_up_with_the_messages(user, messages, answers, error):
    with pytest.raises(ValueError, match=error):
        conversation(owner=user, messages=messages, answers=answers)


def test_answers_are_taken_one_at_a_time(user):
    answers = (f"answer {number}" for number in range(1, 3))
    task = conversation(owner=user, messages=["one", "two", "three"], answers=answers)
    texts = task.subtasks.filter(role="ASSISTANT").order_by("message_id")
    assert [turn.history_text for turn in texts] == ["answer 1", "answer 2", ""]


def test_a_tuple_answer_names_every_pending_step(user):
    with pytest.raises(ValueError, match="1 answers for 2 pending turns"):
        answered_task(owner=user, answer=("only the coder",), pipeline=TWO_STEPS)
