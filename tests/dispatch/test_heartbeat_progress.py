"""Progress carried by the batched heartbeat: one request per worker and interval stores each
claim's progress as a progress post of its own would, refuses each on its own, and the worker's
buffer settles every outcome so that Baton holds exactly what it sent."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings

from backend.tasks.models import ProgressPiece, Subtask, TaskEvent
from backend.tasks.partial_texts import partial_text_of
from executors.client import PartialTextMismatch
from executors.events import MessageDelta
from executors.payloads import ProgressOutcome
from executors.progress import ProgressBatch, ProgressBuffer
from tests.dispatch.test_dispatch_api import create, dispatch, report
from tests.dispatch.test_partial_text_appends import executor_steps, feed

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("pipeline_bots")]


def claim(turn, **progress: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"subtask_id": turn["subtask_id"], "attempt": turn["attempt"]}
    if progress:
        body["progress"] = {"events": [], **progress}
    return body


def heartbeat(worker_api, *claims: dict[str, Any], status: int = 200) -> dict[int, dict]:
    response = worker_api.post(
        "/api/executor/heartbeat/", {"worker_id": "w1", "turns": list(claims)}, format="json"
    )
    assert response.status_code == status, response.json()
    if status != 200:
        return response.json()
    return {turn["subtask_id"]: turn for turn in response.json()["turns"]}


def stored(turn) -> str:
    return partial_text_of(Subtask.objects.get(pk=turn["subtask_id"]))


def two_turns(api, worker_api) -> list[dict]:
    create(api)
    create(api)
    turns = dispatch(worker_api, limit=2)
    assert len(turns) == 2
    return turns


def test_one_heartbeat_stores_the_progress_of_each_claim(api, worker_api):
    first, second = two_turns(api, worker_api)
    answer = heartbeat(
        worker_api,
        claim(first, partial_text="Hello", events=[{"type": "tool_started", "tool": "shell"}]),
        claim(second, partial_text="Bonjour"),
    )
    assert answer[first["subtask_id"]]["state"] == "running"
    assert answer[first["subtask_id"]]["progress"] == {
        "stored": True,
        "partial_text_chars": 5,
        "code": None,
        "detail": None,
    }
    assert answer[second["subtask_id"]]["progress"]["partial_text_chars"] == 7
    answer = heartbeat(
        worker_api,
        claim(first, partial_text_append=", wörld 🌍", partial_text_offset=5),
        claim(second),  # nothing new: a plain heartbeat for this one
    )
    assert answer[first["subtask_id"]]["progress"]["partial_text_chars"] == 14
    assert "progress" not in answer[second["subtask_id"]]
    assert (stored(first), stored(second)) == ("Hello, wörld 🌍", "Bonjour")
    row = Subtask.objects.get(pk=first["subtask_id"])
    assert row.progress_events == [{"type": "tool_started", "tool": "shell"}]
    assert ProgressPiece.objects.filter(subtask_id=first["subtask_id"]).count() == 2
    # The task's event stream hears of it as of a progress post: what the text gained.
    last = TaskEvent.objects.filter(task_id=first["task_id"], type="turn.progress").last()
    assert (last.data["text"], last.data["partial_text_chars"]) == (", wörld 🌍", 14)


def test_a_refused_claim_leaves_the_others_stored(api, worker_api, settings):
    settings.BATON_MAX_MESSAGE_BYTES = 20
    first, second = two_turns(api, worker_api)
    heartbeat(worker_api, claim(first, partial_text="abc"), claim(second, partial_text="xy"))
    answer = heartbeat(
        worker_api,
        claim(first, partial_text_append="def", partial_text_offset=2, events=[{"type": "x"}]),
        claim(second, partial_text_append="z", partial_text_offset=2),
    )
    refused = answer[first["subtask_id"]]
    assert refused["state"] == "running"
    assert refused["progress"]["stored"] is False
    assert refused["progress"]["code"] == "partial_text_mismatch"
    assert refused["progress"]["partial_text_chars"] == 3
    assert "3 characters" in refused["progress"]["detail"]
    assert answer[second["subtask_id"]]["progress"]["stored"] is True
    # Nothing of the refused claim's progress is stored; the other's is.
    row = Subtask.objects.get(pk=first["subtask_id"])
    assert (partial_text_of(row), row.progress_events) == ("abc", [])
    assert stored(second) == "xyz"
    # Over the message limit: refused as a progress post would be (413 too_large).
    answer = heartbeat(worker_api, claim(first, partial_text="x" * 21), claim(second))
    assert answer[first["subtask_id"]]["progress"]["code"] == "too_large"
    assert stored(first) == "abc"


def test_a_cancelled_or_foreign_claim_stores_nothing(api, worker_api, other_worker_api):
    first, second = two_turns(api, worker_api)
    api.post(f"/api/tasks/{first['task_id']}/subtasks/{first['subtask_id']}/cancel/")
    answer = heartbeat(worker_api, claim(first, partial_text="late"))
    assert answer[first["subtask_id"]]["state"] == "cancelled"
    assert answer[first["subtask_id"]]["progress"]["code"] == "cancelled"
    # An account that never held the claim learns nothing and stores nothing.
    answer = heartbeat(other_worker_api, claim(second, partial_text="not mine"))
    assert answer[second["subtask_id"]]["state"] == "lease_lost"
    assert answer[second["subtask_id"]]["progress"]["code"] == "not_found"
    assert (stored(first), stored(second)) == ("", "")


@pytest.mark.parametrize(
    ("progress", "field"),
    [
        ({"partial_text_append": "x"}, "progress.partial_text_offset"),
        ({"partial_text_offset": 0}, "progress.partial_text_append"),
        (
            {"partial_text": "x", "partial_text_append": "x", "partial_text_offset": 0},
            "progress.partial_text",
        ),
        ({"events": "x"}, "progress.events"),
        ({"surprise": 1}, "progress.surprise"),
        ({"partial_text": 5}, "progress.partial_text"),
    ],
)
def test_a_claims_invalid_progress_is_refused_in_its_part_and_the_others_are_stored(
    api, worker_api, progress, field
):
    first, second = two_turns(api, worker_api)
    answer = heartbeat(
        worker_api,
        claim(first, **progress),
        claim(second, partial_text="Bonjour", events=[{"type": "tool_started"}]),
    )
    refused = answer[first["subtask_id"]]
    assert refused["state"] == "running"  # its lease is kept all the same
    assert (refused["progress"]["stored"], refused["progress"]["code"]) == (False, "invalid")
    assert f"{field}: " in refused["progress"]["detail"], refused["progress"]
    assert stored(first) == ""
    assert Subtask.objects.get(pk=first["subtask_id"]).progress_events is None
    assert answer[second["subtask_id"]]["progress"]["stored"] is True
    assert stored(second) == "Bonjour"


def test_progress_that_is_not_an_object_is_refused_in_its_claims_part(api, worker_api):
    first, second = two_turns(api, worker_api)
    body = {
        "worker_id": "w1",
        "turns": [
            {"subtask_id": first["subtask_id"], "attempt": 1, "progress": "x"},
            claim(second, partial_text="ok"),
        ],
    }
    response = worker_api.post("/api/executor/heartbeat/", body, format="json")
    assert response.status_code == 200, response.json()
    refused, fine = response.json()["turns"]
    assert refused["progress"]["code"] == "invalid"
    assert "progress: " in refused["progress"]["detail"]
    assert fine["progress"]["stored"] is True
    assert stored(second) == "ok"


def post_json(worker_api, path: str, body: dict[str, Any]):
    """POST `body` as JSON text with lone surrogates as `\\udXXX` escapes (as a worker's JSON
    encoder writes them; the test client would fail to encode them as UTF-8)."""
    return worker_api.post(path, json.dumps(body), content_type="application/json")


def test_nul_and_lone_surrogates_in_progress_are_stored_not_refused(api, worker_api):
    first, second = two_turns(api, worker_api)
    events = [{"type": "tool_output", "text": "bin\x00ary \ud83d cut", "k\x00\udc00": ["\x00"]}]
    response = post_json(
        worker_api,
        "/api/executor/heartbeat/",
        {
            "worker_id": "w1",
            "turns": [
                claim(first, partial_text="a\x00b\ud800c", events=events),
                claim(second, partial_text="Bonjour"),
            ],
        },
    )
    assert response.status_code == 200, response.content
    answer = {turn["subtask_id"]: turn for turn in response.json()["turns"]}
    assert answer[first["subtask_id"]]["progress"]["stored"] is True
    # One code point for one: the worker's offsets stay right.
    assert answer[first["subtask_id"]]["progress"]["partial_text_chars"] == 5
    assert stored(first) == "a\ufffdb\ufffdc"
    assert stored(second) == "Bonjour"
    # The turn keeps the events as sent (a lossless text column) ...
    assert Subtask.objects.get(pk=first["subtask_id"]).progress_events == events
    # ... and the task's event log (jsonb on PostgreSQL) shows them as U+FFFD.
    logged = TaskEvent.objects.get(task_id=first["task_id"], type="turn.progress")
    assert logged.data["events"] == [
        {"type": "tool_output", "text": "bin\ufffdary \ufffd cut", "k\ufffd\ufffd": ["\ufffd"]}
    ]
    assert logged.data["text"] == "a\ufffdb\ufffdc"
    # An append, and a progress post of its own, take them too.
    response = post_json(
        worker_api,
        "/api/executor/heartbeat/",
        {
            "worker_id": "w1",
            "turns": [claim(first, partial_text_append="\x00", partial_text_offset=5)],
        },
    )
    assert response.json()["turns"][0]["progress"]["partial_text_chars"] == 6
    response = post_json(
        worker_api,
        f"/api/executor/subtasks/{second['subtask_id']}/progress/",
        {
            "worker_id": "w1",
            "attempt": second["attempt"],
            "events": [{"\x00": "\udfff"}],
            "partial_text_append": "\ud800!",
            "partial_text_offset": 7,
        },
    )
    assert response.status_code == 200, response.content
    assert stored(first) == "a\ufffdb\ufffdc\ufffd"
    assert stored(second) == "Bonjour\ufffd!"


@pytest.mark.parametrize(
    ("ref", "field"),
    [
        ({"subtask_id": 2**63}, "turns.0.subtask_id"),
        ({"subtask_id": 2**64}, "turns.0.subtask_id"),
        ({"attempt": 2**31}, "turns.0.attempt"),
        ({"attempt": 2**64}, "turns.0.attempt"),
        ({"steers": [{"steer_id": 2**64, "delivered": True}]}, "turns.0.steers.0.steer_id"),
    ],
)
def test_out_of_range_ids_are_a_400_naming_the_field(api, worker_api, ref, field):
    first, second = two_turns(api, worker_api)
    body = heartbeat(
        worker_api,
        {**claim(first, partial_text="x"), **ref},
        claim(second, partial_text="y"),
        status=400,
    )
    assert field in body["fields"], body
    assert (stored(first), stored(second)) == ("", "")


def test_an_out_of_range_attempt_in_a_progress_post_is_a_400_naming_it(api, worker_api):
    first, _ = two_turns(api, worker_api)
    response = worker_api.post(
        f"/api/executor/subtasks/{first['subtask_id']}/progress/",
        {"worker_id": "w1", "attempt": 2**64, "partial_text": "x"},
        format="json",
    )
    assert response.status_code == 400, response.json()
    assert "attempt" in response.json()["fields"]


def test_each_claim_is_named_once(api, worker_api):
    first, _ = two_turns(api, worker_api)
    body = heartbeat(
        worker_api, claim(first, partial_text="a"), claim(first, partial_text="b"), status=400
    )
    assert "turns" in body["fields"]
    assert stored(first) == ""


# --- the worker's buffer, settled by the heartbeat's answers ---------------------------------


def _beat(worker_api, turn, buffer: ProgressBuffer, outcome: str) -> None:
    """One supervisor heartbeat for `turn`, as `Worker._check_claims` sends it and settles it."""
    batch = buffer.take(force=True)
    if batch is None:
        return
    if outcome == "lost_before":
        buffer.refused(batch)
        return
    answer = heartbeat(worker_api, claim(turn, **batch.to_json()))[turn["subtask_id"]]
    if outcome == "sent_twice":
        answer = heartbeat(worker_api, claim(turn, **batch.to_json()))[turn["subtask_id"]]
    if outcome == "lost_after":
        buffer.refused(batch)
        return
    progress = answer["progress"]
    again = buffer.settle(
        batch,
        ProgressOutcome(progress["stored"], progress["partial_text_chars"], progress["code"]),
    )
    if again is not None:
        buffer.deliver(again, send=lambda batch: _post(worker_api, turn, batch))


def _post(worker_api, turn, batch: ProgressBatch) -> int | None:
    answer = worker_api.post(
        f"/api/executor/subtasks/{turn['subtask_id']}/progress/",
        {"worker_id": "w1", "attempt": turn["attempt"], **batch.to_json()},
        format="json",
    )
    if answer.status_code == 409:
        raise PartialTextMismatch("409", status=409, code=answer.json()["code"])
    assert answer.status_code == 200, answer.json()
    return answer.json()["partial_text_chars"]


@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(steps=executor_steps("beat"))
def test_the_stored_text_is_what_the_buffer_last_sent_whatever_the_heartbeat_lost(
    api, worker_api, steps
):
    create(api)
    [turn] = dispatch(worker_api)
    buffer = ProgressBuffer()
    text = ""
    for step, value in [*steps, ("beat", "ok")]:
        if step != "beat":
            text = feed(buffer, step, value, text)
        else:
            _beat(worker_api, turn, buffer, value)
            if value in ("ok", "sent_twice"):
                # Never lost, never twice: Baton holds exactly what the buffer holds.
                assert stored(turn) == text
    _beat(worker_api, turn, buffer, "ok")
    assert stored(turn) == text
    report(worker_api, turn, result={"value": text or "-"})


def test_a_retried_append_is_refused_and_the_whole_text_goes_alone(api, worker_api):
    create(api)
    [turn] = dispatch(worker_api)
    buffer = ProgressBuffer()
    buffer.add([MessageDelta("Hello")])
    _beat(worker_api, turn, buffer, "ok")
    buffer.add([MessageDelta(", world")])
    _beat(worker_api, turn, buffer, "sent_twice")
    assert stored(turn) == "Hello, world"
