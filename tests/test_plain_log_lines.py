"""Plain log lines (development's console): a Baton event as one short line, JSON unchanged.

The exact lines of the busiest events, each event's every field still in its JSON line, a
real dispatch and result over the API as both formats write them, and the long-polling
plumbing left out of the plain console at INFO.
"""

from __future__ import annotations

import json
import logging

import pytest

from backend.dispatch.models import PromptReport
from backend.events import log_event
from backend.log_format import JsonLineFormatter, PlainLineFormatter, QuietPlumbingEvents

PROMPT = "The launch word is zebracorn; keep it out of the logs."


def logged(caplog: pytest.LogCaptureFixture, event: str, **fields: object) -> logging.LogRecord:
    with caplog.at_level(logging.DEBUG, logger="baton.events"):
        log_event(event, **fields)  # type: ignore[arg-type]
    return caplog.records[-1]


def plain(record: logging.LogRecord) -> str:
    formatter = PlainLineFormatter()
    line = formatter.format(record)
    prefix = f"{formatter.formatTime(record)} {record.levelname} baton.events "
    assert line.startswith(prefix), line
    return line.removeprefix(prefix)


DISPATCH = {
    "task": 3,
    "subtask": 7,
    "message_id": 4,
    "executor": "codex",
    "attempt": 1,
    "kind": "full",
    "tokens": 1234,
    "chars": 4321,
    "resume_reason": "no_session",
    "worker_id": "demo-worker",
}
RESULT = {
    "task": 3,
    "subtask": 7,
    "message_id": 4,
    "reported": "COMPLETED",
    "status": "COMPLETED",
    "error_code": "",
    "attempt": 1,
    "history_chars": 247,
    "spilled": False,
}


@pytest.mark.parametrize(
    ("event", "fields", "line"),
    [
        ("dispatch", DISPATCH, "dispatch task 3 message 4 codex · 1,234 tokens · full prompt"),
        (
            "dispatch",
            {**DISPATCH, "kind": "resume", "tokens": 312, "attempt": 2, "resume_reason": "resume"},
            "dispatch task 3 message 4 codex · 312 tokens · resume prompt · attempt 2",
        ),
        (
            "dispatch",
            {**DISPATCH, "tokens": 1_048_576, "executor": "claude_code"},
            "dispatch task 3 message 4 claude_code · 1,048,576 tokens · full prompt",
        ),
        ("result", RESULT, "result task 3 message 4 COMPLETED"),
        (
            "result",
            {**RESULT, "status": "FAILED", "reported": "FAILED", "error_code": "timeout"},
            "result task 3 message 4 FAILED · timeout",
        ),
        (
            "result",
            {**RESULT, "reported": "RETRY", "status": "PENDING", "error_code": "rate_limited"}
            | {"attempt": 2},
            "result task 3 message 4 RETRY → PENDING · rate_limited · attempt 2",
        ),
        # Any other event: its name and its fields, sorted.
        ("leases_reclaimed", {"requeued": 2, "failed": 0}, "leases_reclaimed failed=0 requeued=2"),
        (
            "turn_stop_confirmed",
            {"task": 3, "subtask": 7, "ok": True, "code": None, "ms": 2.5},
            "turn_stop_confirmed code=null ms=2.5 ok=true subtask=7 task=3",
        ),
        ("dispatch_listener_lost", {}, "dispatch_listener_lost"),
        # Without a field its words need (or with one of another type): the pairs.
        (
            "result",
            {"task": 3, "subtask": 7, "status": "COMPLETED"},
            "result status=COMPLETED subtask=7 task=3",
        ),
        (
            "dispatch",
            {"task": 3, "message_id": 4, "executor": "codex", "kind": "full", "tokens": "many"},
            "dispatch executor=codex kind=full message_id=4 task=3 tokens=many",
        ),
    ],
)
def test_an_event_is_one_short_plain_line_and_keeps_every_field_in_json(
    caplog, event, fields, line
):
    record = logged(caplog, event, **fields)
    assert plain(record) == line
    json_line = json.loads(JsonLineFormatter().format(record))
    assert (json_line["event"], json_line["fields"]) == (event, fields)
    # The plain formatter left the record as it was logged, for the other handlers.
    assert json.loads(record.getMessage()) == {"event": event, **fields}


def test_other_records_keep_the_plain_format(caplog):
    record = logging.LogRecord(
        "django.request", logging.WARNING, __file__, 1, "Gone: %s", ("/x",), None
    )
    formatter = PlainLineFormatter()
    assert (
        formatter.format(record)
        == f"{formatter.formatTime(record)} WARNING django.request Gone: /x"
    )


@pytest.mark.parametrize(
    ("event", "level", "shown"),
    [
        ("dispatch_client_gone", logging.INFO, False),
        ("dispatch_listener_connected", logging.INFO, False),
        ("dispatch_client_gone", logging.WARNING, True),
        ("dispatch_listener_lost", logging.WARNING, True),
        ("dispatch", logging.INFO, True),
    ],
)
def test_the_plain_console_leaves_out_long_polling_plumbing_at_info(caplog, event, level, shown):
    with caplog.at_level(logging.DEBUG, logger="baton.events"):
        log_event(event, level=level, worker_id="w1")
    assert QuietPlumbingEvents().filter(caplog.records[-1]) is shown


def test_the_development_console_writes_plain_lines():
    consoles = [
        handler
        for handler in logging.getLogger().handlers
        if isinstance(handler.formatter, PlainLineFormatter)
    ]
    assert consoles
    assert any(isinstance(each, QuietPlumbingEvents) for each in consoles[0].filters)


# --- a real dispatch and result, as both formats write them ----------------------------------


@pytest.mark.django_db
def test_a_dispatch_and_its_result_are_a_line_each_and_json_keeps_every_column(
    api, worker_api, caplog
):
    task = api.post(
        "/api/tasks/",
        {"title": "Fix", "task_type": "code", "message": PROMPT, "executor": "codex"},
        format="json",
    ).json()
    with caplog.at_level(logging.INFO, logger="baton.events"):
        [turn] = worker_api.post(
            "/api/executor/dispatch/",
            {"kinds": ["codex"], "limit": 1, "worker_id": "w1"},
            format="json",
        ).json()["turns"]
        answered = worker_api.post(
            f"/api/executor/subtasks/{turn['subtask_id']}/result/",
            {"worker_id": "w1", "attempt": 1, "status": "COMPLETED", "result": {"value": "Done."}},
            format="json",
        )
    assert answered.status_code == 200
    records = [record for record in caplog.records if record.name == "baton.events"]
    by_event = {json.loads(record.getMessage())["event"]: record for record in records}
    tokens = turn["prompt_report"]["tokens"]
    assert plain(by_event["dispatch"]) == (
        f"dispatch task {task['id']} message 2 codex · {tokens:,} tokens · full prompt"
    )
    assert plain(by_event["result"]) == f"result task {task['id']} message 2 COMPLETED"
    # JSON keeps the dispatch's every PromptReport column that is logged, and the turn's ids.
    fields = json.loads(JsonLineFormatter().format(by_event["dispatch"]))["fields"]
    columns = {column.name for column in PromptReport._meta.concrete_fields}
    not_logged = {"id", "created_at", "sent", "policy_snapshot", "input_snapshot", "prompt_sha256"}
    assert set(fields) == (columns - not_logged) | {"message_id", "executor"}
    assert fields["tokens"] == tokens
    # Neither format holds the message or the answer.
    for record in records:
        for line in (PlainLineFormatter().format(record), JsonLineFormatter().format(record)):
            assert PROMPT not in line
            assert "zebracorn" not in line
            assert "Done." not in line
