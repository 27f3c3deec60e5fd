"""The event logger: one JSON object per line, and no value that could carry text."""

from __future__ import annotations

import json
import logging

import pytest

from backend.events import log_event, opaque_id


def logged_lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [record.getMessage() for record in caplog.records if record.name == "baton.events"]


def test_an_event_is_one_json_object_on_one_line(caplog):
    with caplog.at_level(logging.INFO, logger="baton.events"):
        log_event(
            "result",
            task=7,
            subtask=12,
            status="COMPLETED",
            error_code="",
            worker_id="worker-1:4242",
            build_ms=1.25,
            spilled=False,
            policy=None,
        )
    [line] = logged_lines(caplog)
    assert "\n" not in line
    assert json.loads(line) == {
        "event": "result",
        "task": 7,
        "subtask": 12,
        "status": "COMPLETED",
        "error_code": "",
        "worker_id": "worker-1:4242",
        "build_ms": 1.25,
        "spilled": False,
        "policy": None,
    }
    # Keys sorted: the same event always reads the same way.
    assert line == json.dumps(json.loads(line), sort_keys=True)


def test_the_level_is_the_callers(caplog):
    with caplog.at_level(logging.INFO, logger="baton.events"):
        log_event("dispatch_build_failed", level=logging.ERROR, error_type="RuntimeError")
    [record] = [record for record in caplog.records if record.name == "baton.events"]
    assert record.levelno == logging.ERROR


@pytest.mark.parametrize(
    ("value", "error"),
    [
        ("the secret launch code is 0000", ValueError),  # free text
        ("line\nbreak", ValueError),
        ("x" * 65, ValueError),  # too long to be an id
        ('{"value": "a result"}', ValueError),
        ({"value": "a result"}, TypeError),
        (["an", "answer"], TypeError),
        (b"bytes", TypeError),
        (float("nan"), ValueError),
        (float("inf"), ValueError),
    ],
)
def test_a_value_that_could_carry_text_is_refused(caplog, value, error):
    with caplog.at_level(logging.DEBUG, logger="baton.events"), pytest.raises(error):
        log_event("result", task=1, message=value)
    assert logged_lines(caplog) == []


def test_values_are_checked_even_when_the_level_is_off(caplog):
    with caplog.at_level(logging.CRITICAL, logger="baton.events"), pytest.raises(ValueError):
        log_event("result", message="free text that must not reach a log")


@pytest.mark.parametrize("event", ["Dispatch", "dispatch event", "", "x" * 65])
def test_the_event_name_is_an_identifier(event):
    with pytest.raises(ValueError):
        log_event(event, task=1)


def test_event_is_not_a_field():
    with pytest.raises(ValueError):
        log_event("result", event="other")


def test_opaque_id_keeps_identifiers_and_hides_anything_else():
    assert opaque_id("worker-codex-1") == "worker-codex-1"
    hidden = opaque_id("Alice's laptop, second worker")
    assert hidden.startswith("sha256:") and "Alice" not in hidden
    assert hidden == opaque_id("Alice's laptop, second worker")
    assert opaque_id("w" * 200) != opaque_id("w" * 201)
    log_event("dispatch", worker_id=hidden)  # always loggable
