"""The fault run's checks (`bench/_fault_checks.py`) see what they are there to see: a message
with no answer is lost, one with two is answered twice, a turn left running is stuck; and the
model the run scripts asks every conversation for its commands, then answers."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from django.contrib.auth import get_user_model

from backend.prompting import Role
from backend.tasks.models import Subtask, Task
from backend.tasks.services import PipelineStep, create_task
from bench._fault_checks import SentMessage, check_conversations, route_of, settled
from bench.faults import BusyAgentModel

pytestmark = pytest.mark.django_db

TEXT = "Why is CI red?"


def _answered_task(text: str = TEXT) -> Task:
    """A task whose first message got its answer."""
    owner, _ = get_user_model().objects.get_or_create(username="owner")
    task = create_task(
        owner=owner,
        title="t",
        task_type="code",
        message=text,
        pipeline=[PipelineStep(executor="codex")],
    )
    Subtask.objects.filter(task=task, role=Role.ASSISTANT).update(status="COMPLETED")
    Task.objects.filter(pk=task.pk).update(status="COMPLETED")
    return task


def test_a_message_answered_once_breaks_nothing():
    _answered_task()

    findings = check_conversations([SentMessage(TEXT, "create", 201)])

    assert (findings.lost, findings.answered_twice, findings.stuck) == ([], [], [])
    assert settled()


def test_a_message_without_its_answer_is_lost():
    task = _answered_task()
    Subtask.objects.filter(task=task, role=Role.ASSISTANT).delete()

    findings = check_conversations([SentMessage(TEXT, "create", 201)])

    assert findings.lost == [f"task {task.pk} message 1: no answer"]


def test_a_message_with_two_answers_is_answered_twice():
    task = _answered_task()
    answer = Subtask.objects.get(task=task, role=Role.ASSISTANT)
    answer.pk, answer.message_id = None, 3
    answer.save()

    findings = check_conversations([SentMessage(TEXT, "create", 201)])

    assert findings.answered_twice == [f"task {task.pk} message 1: 2 answers"]


def test_a_turn_left_running_is_stuck():
    task = _answered_task()
    Subtask.objects.filter(task=task, role=Role.ASSISTANT).update(
        status="RUNNING", attempts=1, lease_owner="w1"
    )

    findings = check_conversations([SentMessage(TEXT, "create", 201)])

    assert findings.stuck == [f"task {task.pk} message 2: RUNNING (attempt 1, worker 'w1')"]
    assert not settled()


def test_an_accepted_message_never_stored_is_lost_and_one_never_answered_is_not():
    findings = check_conversations(
        [SentMessage("accepted", "enqueue", 202), SentMessage("no answer", "steer", None)]
    )

    assert findings.lost == ["sent message 0 (enqueue, answer 202): accepted, never stored"]
    assert findings.not_accepted == 1


def test_a_5xx_is_counted_by_its_route_never_its_ids():
    assert route_of("/api/tasks/12/messages/") == "/api/tasks/<id:task_id>/messages/"
    assert route_of("/nowhere/") == "(no route)"


def test_the_busy_model_asks_for_each_command_then_answers():
    model = BusyAgentModel(tool_calls=2, tool_seconds=0.1)
    conversation: list[object] = [{"role": "user", "content": "Go"}]

    def next_turn():  # a Claude Code request (the Messages API) with the conversation so far
        return model._take_turn(SimpleNamespace(api="messages", body={"messages": conversation}))

    first = next_turn()
    conversation.append({"tool_use": first.call.arguments_json()})
    second = next_turn()
    conversation.append({"tool_use": second.call.arguments_json()})
    answer = next_turn()

    assert first.call.arguments == {"command": "sleep 0.1 # fault-step-1"}
    assert second.call.arguments == {"command": "sleep 0.1 # fault-step-2"}
    assert (answer.call, answer.text) == (None, "Done, in 2 steps.")
