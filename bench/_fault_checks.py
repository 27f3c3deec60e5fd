"""What a fault run (`bench/faults.py`) checks once it has drained: every message the product
sent answered, and answered once; nothing left pending or running; and every answer the server
gave, 5xx ones by route, from its own access log.

Read from the benchmark's database (the ORM, in the measuring process) and from the server's
log files (`bench._live.live_baton(log_dir=…)`). What they report names tasks, turns and
routes by id and counts, never a message's text.

A message is found by its text, which the load makes unique: one the server accepted (2xx)
must be stored, once, as a USER turn (or have been withdrawn from the queue); one whose answer
never came (the connection broke, as it does when a server process is killed) may or may not
have been stored, and is checked like the others when it was. A stored message is answered:

- a round's message by one ASSISTANT turn per pipeline step, each finished (completed, failed,
  or stopped: cancelled, interrupted, rolled back);
- a steer by the running turn it was given to, when that turn completed on the attempt that
  took it in (`delivered`); by the round of the newer message that stopped that turn
  (`superseded`); by a round of its own when it fell back to the queue; or not at all when
  its task was cancelled.
"""

from __future__ import annotations

import json
import re
from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

FINISHED = ("COMPLETED", "FAILED", "CANCELLED", "INTERRUPTED")
ACTIVE = ("PENDING", "RUNNING")


@dataclass(frozen=True)
class SentMessage:
    """A message the load sent: a task's first message or a follow-up."""

    text: str
    strategy: str  # "create", or the follow-up strategy
    status: int | None  # the HTTP answer; None when none came (the connection broke)


@dataclass
class Findings:
    """What broke an invariant, one line each (ids and counts, never texts)."""

    lost: list[str] = field(default_factory=list)
    answered_twice: list[str] = field(default_factory=list)
    stuck: list[str] = field(default_factory=list)
    # Sent with no answer and never stored: the server never took them (not a loss).
    not_accepted: int = 0
    # Refused (4xx) and stored all the same.
    refused_but_stored: list[str] = field(default_factory=list)
    # Steers that fell back to the queue and were withdrawn with it when their task was
    # cancelled, their own status still `queued` (not a loss: the user cancelled the task).
    queued_steers_cancelled: list[str] = field(default_factory=list)


def check_conversations(sent: Sequence[SentMessage]) -> Findings:
    """Lost, answered twice and stuck, over every task in the database and every message the
    load sent."""
    from backend.tasks.models import QueuedMessage, Steer, Subtask, Task

    findings = Findings()
    turns = list(
        Subtask.objects.filter(kind="turn").values(
            "id",
            "task_id",
            "message_id",
            "role",
            "status",
            "attempts",
            "parent_message_id",
            "pipeline_step",
            "steered_into_message_id",
            "message",
        )
    )
    user_turns = [turn for turn in turns if turn["role"] == "USER"]
    by_id = {turn["id"]: turn for turn in turns}
    answers: dict[tuple[int, int], list[dict]] = defaultdict(list)
    for turn in turns:
        if turn["role"] == "ASSISTANT":
            answers[(turn["task_id"], turn["parent_message_id"])].append(turn)
    steers = {
        steer["message_id"]: steer
        for steer in Steer.objects.values(
            "message_id", "status", "attempt", "target_id", "fallback_reason"
        )
    }
    steps = dict(Task.objects.values_list("id", "pipeline"))

    stored = Counter(turn["message"] for turn in user_turns)
    queued = dict(QueuedMessage.objects.values_list("message", "status"))
    steer_queue = dict(
        QueuedMessage.objects.filter(subtask__isnull=False).values_list("subtask_id", "status")
    )
    for number, message in enumerate(sent):
        name = f"sent message {number} ({message.strategy}, answer {message.status})"
        times = stored[message.text]
        if message.status is not None and message.status >= 400:
            if times or message.text in queued:
                findings.refused_but_stored.append(name)
        elif times > 1:
            findings.answered_twice.append(f"{name}: stored as {times} USER turns")
        elif times == 0 and queued.get(message.text) == "queued":
            findings.stuck.append(f"{name}: still queued")
        elif times == 0 and message.text not in queued:
            if message.status is None:
                findings.not_accepted += 1
            else:
                findings.lost.append(f"{name}: accepted, never stored")

    for user in user_turns:
        name = f"task {user['task_id']} message {user['message_id']}"
        own = answers[(user["task_id"], user["message_id"])]
        steer = steers.get(user["id"])
        if user["steered_into_message_id"] is not None:
            _check_steer(findings, name, steer, by_id, own, steer_queue.get(user["id"]))
            continue
        by_step = Counter(turn["pipeline_step"] for turn in own)
        if not own:
            findings.lost.append(f"{name}: no answer")
        elif any(count > 1 for count in by_step.values()):
            findings.answered_twice.append(f"{name}: {len(own)} answers")
        elif len(own) < len(steps[user["task_id"]]):
            findings.lost.append(f"{name}: {len(own)} of {len(steps[user['task_id']])} answers")
        if steer is not None and steer["status"] == "delivered":
            findings.answered_twice.append(f"{name}: by the turn it steered and by its own round")

    findings.answered_twice += _finished_twice()
    findings.stuck += _stuck()
    return findings


def _check_steer(
    findings: Findings,
    name: str,
    steer: dict | None,
    by_id: dict[int, dict],
    own: list[dict],
    queued: str | None,
) -> None:
    """A USER turn given to a running turn (no round of its own); `queued`: the status of
    the queued message it became when it fell back, if it did."""
    if own:
        findings.answered_twice.append(f"{name}: a steer with answers of its own")
    if steer is None:
        findings.lost.append(f"{name}: steered, with no steer")
    elif steer["status"] == "pending":
        findings.stuck.append(f"{name}: steer still pending")
    elif steer["status"] == "queued" and queued == "cancelled":
        findings.queued_steers_cancelled.append(name)
    elif steer["status"] == "queued":
        target = by_id[steer["target_id"]]
        findings.lost.append(
            f"{name}: steer fell back to the queue ({steer['fallback_reason']}), no round "
            f"answered it; it was given to message {target['message_id']} (attempt "
            f"{steer['attempt']}), which ended {target['status']} on attempt {target['attempts']}"
        )
    elif steer["status"] == "delivered":
        target = by_id[steer["target_id"]]
        if target["status"] != "COMPLETED" or target["attempts"] != steer["attempt"]:
            findings.lost.append(
                f"{name}: delivered to attempt {steer['attempt']} of message "
                f"{target['message_id']}, which ended {target['status']} on attempt "
                f"{target['attempts']}"
            )


def _finished_twice() -> list[str]:
    """Turns whose event log says they finished more than once (a result recorded twice)."""
    from django.db.models import Count

    from backend.tasks.models import TaskEvent
    from backend.tasks.task_events import FINISHED_EVENTS

    twice = (
        TaskEvent.objects.filter(type__in=list(FINISHED_EVENTS.values()))
        .values("task_id", "subtask_id")
        .annotate(times=Count("id"))
        .filter(times__gt=1)
    )
    return [
        f"task {row['task_id']} subtask {row['subtask_id']}: finished {row['times']} times"
        for row in twice
    ]


def _stuck() -> list[str]:
    """Turns (and summary jobs) still pending or running, tasks whose status says a turn runs,
    queued messages never sent."""
    from backend.tasks.models import QueuedMessage, Subtask, Task

    stuck = [
        f"task {task_id} message {message_id}: {status} (attempt {attempts}, worker {owner!r})"
        for task_id, message_id, status, attempts, owner in Subtask.objects.filter(
            status__in=ACTIVE
        ).values_list("task_id", "message_id", "status", "attempts", "lease_owner")
    ]
    active_tasks = set(Subtask.objects.filter(status__in=ACTIVE).values_list("task_id", flat=True))
    for task_id, status in Task.objects.filter(status__in=ACTIVE).values_list("id", "status"):
        running = "" if task_id in active_tasks else " with nothing pending or running"
        stuck.append(f"task {task_id}: {status}{running}")
    stuck += [
        f"task {task_id}: queued message {queued_id} never sent"
        for queued_id, task_id in QueuedMessage.objects.filter(status="queued").values_list(
            "id", "task_id"
        )
    ]
    return stuck


def tasks_with_two_rounds_active() -> set[int]:
    """Tasks with more than one ASSISTANT turn pending or running now: with one pipeline step
    a task, two rounds at once (a task's next round waits for the one before it)."""
    from django.db.models import Count

    from backend.tasks.models import Subtask

    return set(
        Subtask.objects.filter(kind="turn", role="ASSISTANT", status__in=ACTIVE)
        .values("task_id")
        .annotate(active=Count("id"))
        .filter(active__gt=1)
        .values_list("task_id", flat=True)
    )


def settled() -> bool:
    """Whether nothing is pending, running or queued, and no task says otherwise."""
    from backend.tasks.models import QueuedMessage, Subtask, Task

    return not (
        Subtask.objects.filter(status__in=ACTIVE).exists()
        or Task.objects.filter(status__in=ACTIVE).exists()
        or QueuedMessage.objects.filter(status="queued").exists()
    )


# Findings about a task start with "task N".
TASK_FINDING = re.compile(r"^task (\d+)")
# Event fields that may hold a text (progress is left out whole).
TEXT_FIELDS = frozenset({"message", "text", "events", "partial_text", "error"})


def task_histories(findings: Findings) -> dict[int, dict[str, Any]]:
    """For every task a finding names: its turns, steers, queued messages and events in
    order, with ids, statuses, codes and times only — what it takes to see how it came to
    that, once the benchmark's database is gone."""
    from backend.tasks.models import QueuedMessage, Steer, Subtask, TaskEvent

    lines = [*findings.lost, *findings.answered_twice, *findings.stuck]
    task_ids = sorted({int(m.group(1)) for line in lines if (m := TASK_FINDING.match(line))})
    histories = {}
    for task_id in task_ids:
        turns = Subtask.objects.filter(task_id=task_id).order_by("message_id")
        histories[task_id] = {
            "turns": list(
                turns.values(
                    "id",
                    "message_id",
                    "kind",
                    "role",
                    "status",
                    "error_code",
                    "attempts",
                    "parent_message_id",
                    "steered_into_message_id",
                    "lease_owner",
                    "created_at",
                    "started_at",
                    "finished_at",
                )
            ),
            "steers": list(
                Steer.objects.filter(task_id=task_id).values(
                    "id",
                    "message__message_id",
                    "target__message_id",
                    "attempt",
                    "status",
                    "fallback_reason",
                    "created_at",
                    "delivered_at",
                    "settled_at",
                )
            ),
            "queued_messages": list(
                QueuedMessage.objects.filter(task_id=task_id).values(
                    "id",
                    "status",
                    "subtask__message_id",
                    "created_at",
                    "sent_at",
                    "cancelled_at",
                )
            ),
            "events": [
                {
                    **{key: value for key, value in event.items() if key != "data"},
                    **{k: v for k, v in event["data"].items() if k not in TEXT_FIELDS},
                }
                for event in TaskEvent.objects.filter(task_id=task_id)
                .exclude(type="turn.progress")
                .order_by("seq")
                .values("seq", "type", "subtask_id", "data", "created_at")
            ],
        }
    return histories


@dataclass
class ServerLog:
    """What the server's logs say from a moment on: each answer's status, the 5xx ones by
    route, and the failures the server logged (`request_failed`: the view and the type of the
    exception, never its text); and the 5xx answered before that moment."""

    statuses: Counter[int] = field(default_factory=Counter)
    errors: Counter[str] = field(default_factory=Counter)  # "POST /api/…/ 500"
    failures: Counter[str] = field(default_factory=Counter)  # "POST dispatch IntegrityError"
    errors_before: Counter[str] = field(default_factory=Counter)
    failures_before: Counter[str] = field(default_factory=Counter)

    @property
    def requests(self) -> int:
        return sum(self.statuses.values())

    @property
    def server_errors(self) -> int:
        return sum(count for status, count in self.statuses.items() if status >= 500)


def read_server_log(log_dir: Path, *, since: datetime) -> ServerLog:
    """The access log (`server-access.log`) and the error log (`server-errors.log`) of a
    production server (`backend.log_format`: one JSON object a line), from `since` on."""
    found = ServerLog()
    for line, before in _json_lines(log_dir / "server-access.log", since=since):
        request = line.get("request")
        if not isinstance(request, dict) or request.get("status") is None:
            continue
        status = int(request["status"])
        error = f"{request['method']} {route_of(request['path'])} {status}"
        if before:
            found.errors_before[error] += status >= 500
            continue
        found.statuses[status] += 1
        if status >= 500:
            found.errors[error] += 1
    for line, before in _json_lines(log_dir / "server-errors.log", since=since):
        if line.get("event") == "request_failed":
            fields = line.get("fields", {})
            failure = f"{fields.get('method')} {fields.get('view')} {fields.get('error_type')}"
            (found.failures_before if before else found.failures)[failure] += 1
    found.errors_before = +found.errors_before  # only the 5xx
    return found


def route_of(path: str) -> str:
    """The URL pattern `path` matches (`/api/tasks/<id:task_id>/`), never its ids."""
    from django.urls import Resolver404, resolve

    try:
        return "/" + resolve(path).route
    except Resolver404:
        return "(no route)"


def _json_lines(path: Path, *, since: datetime) -> list[tuple[dict, bool]]:
    """Each JSON line of the log, and whether it was written before `since`."""
    if not path.exists():
        return []
    lines = []
    for raw in path.read_text(errors="replace").splitlines():
        try:
            line = json.loads(raw)
        except ValueError:
            continue  # a line cut short by a kill, or not one of Baton's
        if isinstance(line, dict) and "time" in line:
            lines.append((line, datetime.fromisoformat(line["time"]) < since))
    return lines
