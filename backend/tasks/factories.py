"""Tasks that already hold a conversation, made through the real services.

The demo data, the benchmarks and the tests all need "a task whose turns were answered". They
make it here, the way the API and a worker do: `create_task`, then `record_result` for each
PENDING assistant turn, then `append_message` for the next message. What they get is therefore
what a real conversation leaves behind (message ids, ingestion, spilled artifacts, pipeline
order), never rows written by hand.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from django.contrib.auth.models import User

from backend.prompting import Role
from backend.tasks.models import TURNS, Subtask, SubtaskStatus, Task
from backend.tasks.services import PipelineStep, append_message, create_task, record_result

# One text that every step of the pipeline answers, or one text per step, in pipeline order.
Answer = str | tuple[str, ...]

CODEX = PipelineStep(executor="codex")


def pending_assistant_turns(*, task: Task) -> list[Subtask]:
    """The task's PENDING assistant turns, in pipeline order."""
    return list(
        task.subtasks.filter(TURNS, role=Role.ASSISTANT, status=SubtaskStatus.PENDING).order_by(
            "message_id"
        )
    )


def answer_pending(*, task: Task, answer: Answer) -> list[Subtask]:
    """Record a COMPLETED result for each PENDING assistant turn; return the recorded turns.

    A tuple gives each step its own text and must have one text per pending turn.
    """
    turns = pending_assistant_turns(task=task)
    texts = answer if isinstance(answer, tuple) else (answer,) * len(turns)
    if len(texts) != len(turns):
        raise ValueError(f"{len(texts)} answers for {len(turns)} pending turns of task {task.pk}")
    return [
        record_result(subtask=turn, status=SubtaskStatus.COMPLETED, result={"value": text})
        for turn, text in zip(turns, texts, strict=True)
    ]


def conversation(
    *,
    owner: User,
    messages: Sequence[str],
    answers: Iterable[Answer],
    title: str = "Conversation",
    task_type: str = "code",
    pipeline: Sequence[PipelineStep] | PipelineStep = CODEX,
    sender: str = "",
    is_group_chat: bool = False,
) -> Task:
    """A task whose `messages` were sent in order, each answered by the next of `answers`.

    Each answer is recorded before the next message is sent, as the API requires. With one
    answer fewer than messages, the last message is left waiting for its answer (its turns
    PENDING), as a follow-up a worker has not picked up yet. Answers are taken one at a time,
    so a generator keeps a long conversation's big results out of memory; answers that do not
    pair up with the messages raise ValueError once that is seen (the turns made stay).
    """
    if not messages:
        raise ValueError("a conversation starts with a message")
    first, *follow_ups = messages
    task = create_task(
        owner=owner,
        title=title,
        task_type=task_type,
        message=first,
        pipeline=pipeline,
        sender=sender,
        is_group_chat=is_group_chat,
    )
    remaining = iter(answers)
    for number, follow_up in enumerate(follow_ups, start=1):
        answer = next(remaining, None)
        if answer is None:
            raise ValueError(f"message {number} of {len(messages)} has no answer")
        answer_pending(task=task, answer=answer)
        append_message(task=task, message=follow_up, sender=sender)
    last = next(remaining, None)
    if last is not None:
        answer_pending(task=task, answer=last)
    if next(remaining, None) is not None:
        raise ValueError(f"more answers than the {len(messages)} messages")
    return task


def answered_task(
    *,
    owner: User,
    message: str = "Run the tests.",
    answer: Answer = "Done.",
    title: str = "Answered task",
    task_type: str = "code",
    pipeline: Sequence[PipelineStep] | PipelineStep = CODEX,
    sender: str = "",
    is_group_chat: bool = False,
) -> Task:
    """A task with one message that every step of its pipeline has answered."""
    return conversation(
        owner=owner,
        messages=[message],
        answers=[answer],
        title=title,
        task_type=task_type,
        pipeline=pipeline,
        sender=sender,
        is_group_chat=is_group_chat,
    )
