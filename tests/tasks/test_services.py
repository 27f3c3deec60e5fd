"""Services of the task store: rounds of turns, follow-ups, cancellation, results, validation."""

from __future__ import annotations

import pytest
from django.db import IntegrityError

from backend.errors import Conflict, InvalidInput, NotFound, PayloadTooLarge
from backend.prompting import Role
from backend.tasks.factories import answer_pending
from backend.tasks.models import Subtask, SubtaskStatus, Task, TaskStatus
from backend.tasks.services import (
    PipelineStep,
    allocate_message_ids,
    append_message,
    cancel_task,
    create_task,
    record_result,
    validate_message_text,
)

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("pipeline_bots")]

TWO_STEPS = [
    PipelineStep(bot="coder", executor="codex"),
    PipelineStep(bot="reviewer", executor="claude_code", context_passing="previous_bot"),
]


def make_task(owner, pipeline=None, **kwargs) -> Task:
    return create_task(
        owner=owner,
        title=kwargs.pop("title", "Fix the build"),
        task_type=kwargs.pop("task_type", "code"),
        message=kwargs.pop("message", "The build is red, please fix it."),
        pipeline=pipeline or [PipelineStep(executor="codex")],
        **kwargs,
    )


def turns(task: Task) -> list[tuple]:
    return list(
        task.subtasks.order_by("message_id").values_list(
            "message_id", "parent_message_id", "role", "status", "bot", "pipeline_step"
        )
    )


def finish_round(task: Task) -> None:
    answer_pending(task=task, answer="done")


def test_create_task_stores_user_turn_and_one_pending_turn_per_step(user):
    task = make_task(user, pipeline=TWO_STEPS)
    assert turns(task) == [
        (1, None, Role.USER, SubtaskStatus.COMPLETED, "", None),
        (2, 1, Role.ASSISTANT, SubtaskStatus.PENDING, "coder", 0),
        (3, 1, Role.ASSISTANT, SubtaskStatus.PENDING, "reviewer", 1),
    ]
    task.refresh_from_db()
    assert task.status == TaskStatus.PENDING
    assert task.next_message_id == 4
    coder, reviewer = task.subtasks.filter(role=Role.ASSISTANT).order_by("message_id")
    assert coder.pending_since is not None
    assert reviewer.pending_since is None  # waits for the coder
    assert reviewer.context_passing == "previous_bot"
    assert task.is_multi_bot


def test_a_round_is_stored_at_one_moment(user):
    """The user turn is finished when it is stored: never before it was created."""
    task = make_task(user, pipeline=TWO_STEPS)
    user_turn, *assistant_turns = task.subtasks.order_by("message_id")
    assert user_turn.finished_at == user_turn.created_at
    assert {turn.created_at for turn in assistant_turns} == {user_turn.created_at}
    assert [turn.finished_at for turn in assistant_turns] == [None, None]


def test_follow_up_is_refused_while_a_turn_is_pending_and_stores_nothing(user):
    task = make_task(user)
    before = turns(task)
    with pytest.raises(Conflict, match="PENDING"):
        append_message(task=task, message="and also this")
    assert turns(task) == before
    task.refresh_from_db()
    assert task.next_message_id == 3  # the refused follow-up reserved no ids


def test_follow_up_after_completion_continues_message_ids(user):
    task = make_task(user, pipeline=TWO_STEPS)
    finish_round(task)
    task.refresh_from_db()
    assert task.status == TaskStatus.COMPLETED
    new_turns = append_message(task=task, message="Now add a test.", sender="bob")
    assert [(t.message_id, t.parent_message_id, t.role) for t in new_turns] == [
        (4, None, Role.USER),
        (5, 4, Role.ASSISTANT),
        (6, 4, Role.ASSISTANT),
    ]
    assert new_turns[0].sender == "bob"
    task.refresh_from_db()
    assert task.status == TaskStatus.PENDING


def test_pipeline_step_becomes_dispatchable_when_previous_completes(user):
    task = make_task(user, pipeline=TWO_STEPS)
    coder, reviewer = task.subtasks.filter(role=Role.ASSISTANT).order_by("message_id")
    record_result(subtask=coder, status=SubtaskStatus.COMPLETED, result={"value": "patched"})
    reviewer.refresh_from_db()
    assert reviewer.pending_since is not None
    task.refresh_from_db()
    assert task.status == TaskStatus.PENDING


def test_failed_step_fails_the_steps_after_it(user):
    task = make_task(user, pipeline=TWO_STEPS)
    coder = task.subtasks.get(message_id=2)
    record_result(subtask=coder, status=SubtaskStatus.FAILED, error="codex exited with 1")
    reviewer = task.subtasks.get(message_id=3)
    assert reviewer.status == SubtaskStatus.FAILED
    assert "step 0 (coder) failed" in reviewer.error
    task.refresh_from_db()
    assert task.status == TaskStatus.FAILED
    # A failed round does not block the next follow-up.
    append_message(task=task, message="try again")


@pytest.mark.parametrize(
    ("status", "result", "error"),
    [
        (SubtaskStatus.COMPLETED, {"value": "x" * 30_000, "files": ["a.py"]}, ""),
        (SubtaskStatus.COMPLETED, {"answer": 42}, ""),
        (SubtaskStatus.FAILED, None, "codex exited with 1"),
    ],
)
def test_every_column_a_result_sets_is_stored(user, status, result, error):
    # A result writes only the columns it sets: each of them must reach the row.
    task = make_task(user)
    turn = task.subtasks.get(message_id=2)
    recorded = record_result(
        subtask=turn,
        status=status,
        result=result,
        error=error,
        error_code="executor_failed" if error else "",
        usage={"input_tokens": 10, "output_tokens": 2},
        native_session_id="session-1",
    )
    stored = Subtask.objects.get(pk=turn.pk)
    assert stored.status == status
    for field in Subtask._meta.concrete_fields:
        if field.name != "updated_at":
            assert getattr(stored, field.attname) == getattr(recorded, field.attname), field.name
    assert stored.updated_at >= recorded.finished_at


def test_result_cannot_be_recorded_twice(user):
    task = make_task(user)
    turn = task.subtasks.get(message_id=2)
    record_result(subtask=turn, status=SubtaskStatus.COMPLETED, result={"value": "a"})
    with pytest.raises(Conflict):
        record_result(subtask=turn, status=SubtaskStatus.COMPLETED, result={"value": "b"})
    turn.refresh_from_db()
    assert turn.result == {"value": "a"}


def test_cancel_cancels_active_turns_and_blocks_follow_ups(user):
    task = make_task(user, pipeline=TWO_STEPS)
    cancel_task(task=task)
    assert set(task.subtasks.filter(role=Role.ASSISTANT).values_list("status", flat=True)) == {
        SubtaskStatus.CANCELLED
    }
    assert cancel_task(task=task).status == TaskStatus.CANCELLED  # idempotent
    with pytest.raises(Conflict, match="cancelled"):
        append_message(task=task, message="hello?")


def test_group_chat_requires_a_sender(user):
    with pytest.raises(InvalidInput) as error:
        make_task(user, is_group_chat=True)
    assert error.value.field == "sender"
    assert not Task.objects.exists()


@pytest.mark.parametrize(
    ("text", "error_type", "fragment"),
    [
        ("", InvalidInput, "must not be empty"),
        ("  \n\t", InvalidInput, "must not be empty"),
        ("a\x00b", InvalidInput, "NUL"),
        ("bad \ud800 surrogate", InvalidInput, "lone surrogate at position 4"),
        ("é" * 600, PayloadTooLarge, "1200 bytes of UTF-8; the limit is 1000 bytes"),
    ],
)
def test_message_validation(settings, text, error_type, fragment):
    settings.BATON_MAX_MESSAGE_BYTES = 1000
    with pytest.raises(error_type, match=fragment) as error:
        validate_message_text(text=text)
    assert error.value.field == "message"


def test_message_at_the_limit_is_accepted(settings):
    settings.BATON_MAX_MESSAGE_BYTES = 1000
    validate_message_text(text="é" * 500)


def test_unknown_executor_and_task_type_are_rejected(user):
    with pytest.raises(InvalidInput, match="executor 'gpt' is not one of"):
        make_task(user, pipeline=[PipelineStep(bot="a", executor="gpt")])
    with pytest.raises(InvalidInput) as error:
        make_task(user, task_type="Code Review!")
    assert error.value.field == "task_type"
    assert not Subtask.objects.exists()


def test_a_pipeline_longer_than_the_setting_is_refused_before_anything_is_stored(
    user, settings, artifact_storage_in_tmp
):
    settings.BATON_MAX_PIPELINE_STEPS = 3
    # A message long enough to be stored as an artifact if the round were written.
    message = "x" * (settings.BATON_SPILL_THRESHOLD_CHARS + 1)
    with pytest.raises(InvalidInput) as error:
        make_task(user, pipeline=[PipelineStep(executor="codex")] * 4, message=message)
    assert (error.value.field, error.value.message) == (
        "pipeline",
        "pipeline has 4 steps; at most 3 are allowed.",
    )
    assert not Task.objects.exists()
    assert not Subtask.objects.exists()
    assert [path for path in artifact_storage_in_tmp.rglob("*") if path.is_file()] == []
    task = make_task(user, pipeline=[PipelineStep(executor="codex")] * 3)
    assert len(task.pipeline) == 3


def test_allocate_message_ids_on_a_missing_task():
    with pytest.raises(NotFound):
        allocate_message_ids(task_id=999_999, count=1)


def test_database_refuses_duplicate_message_ids(user):
    task = make_task(user)
    with pytest.raises(IntegrityError):
        Subtask.objects.create(
            task=task, message_id=1, role=Role.USER, status=SubtaskStatus.COMPLETED
        )
