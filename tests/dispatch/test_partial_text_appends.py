"""A running turn's partial answer sent as what it gained: the executor API's contract (append at
an offset, 409 on a mismatch, 413 over the limit), the worker's buffer against the real API
(stored text == what the buffer sent, whatever failed), and the fold and pruning when an
attempt ends."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from backend.tasks.models import ProgressPiece, Subtask, TaskEvent
from backend.tasks.partial_texts import partial_text_of
from executors.client import BackendUnavailable, PartialTextMismatch
from executors.events import MessageCompleted, MessageDelta, ToolStarted
from executors.progress import ProgressBatch, ProgressBuffer
from tests.dispatch.test_dispatch_api import create, dispatch, report

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("pipeline_bots")]


def post(worker_api, turn, **body: Any):
    return worker_api.post(
        f"/api/executor/subtasks/{turn['subtask_id']}/progress/",
        {"worker_id": "w1", "attempt": turn["attempt"], "events": [], **body},
        format="json",
    )


def stored(turn) -> str:
    return partial_text_of(Subtask.objects.get(pk=turn["subtask_id"]))


def test_an_append_at_the_stored_length_extends_the_text_by_one_row(api, worker_api):
    task = create(api)
    [turn] = dispatch(worker_api)
    answer = post(worker_api, turn, partial_text="Hello")
    assert (answer.status_code, answer.json()["partial_text_chars"]) == (200, 5)
    answer = post(worker_api, turn, partial_text_append=", wörld 🌍", partial_text_offset=5)
    assert (answer.status_code, answer.json()["partial_text_chars"]) == (200, 14)
    assert stored(turn) == "Hello, wörld 🌍"
    row = Subtask.objects.get(pk=turn["subtask_id"])
    assert (row.partial_text, row.partial_text_chars) == ("", 14)
    assert row.partial_text_bytes == len("Hello, wörld 🌍".encode())
    assert ProgressPiece.objects.filter(subtask_id=turn["subtask_id"]).count() == 2
    # The product reads the whole text, in the task and in its page of turns.
    shown = api.get(f"/api/tasks/{task['id']}/").json()["turns"][1]
    assert shown["partial_text"] == "Hello, wörld 🌍"
    page = api.get(f"/api/tasks/{task['id']}/subtasks/").json()["results"][1]
    assert page["partial_text"] == "Hello, wörld 🌍"
    # The event says what the text gained.
    last = TaskEvent.objects.filter(task_id=task["id"], type="turn.progress").last()
    assert (last.data["text"], last.data["partial_text_chars"]) == (", wörld 🌍", 14)


def test_a_mismatched_offset_is_409_naming_the_field_and_stores_nothing(api, worker_api):
    create(api)
    [turn] = dispatch(worker_api)
    post(worker_api, turn, partial_text="abc")
    answer = post(
        worker_api,
        turn,
        partial_text_append="def",
        partial_text_offset=2,
        events=[{"type": "tool_started"}],
    )
    assert answer.status_code == 409
    body = answer.json()
    assert body["code"] == "partial_text_mismatch"
    assert body["partial_text_chars"] == 3
    assert list(body["fields"]) == ["partial_text_offset"]
    assert "3 characters" in body["detail"]
    row = Subtask.objects.get(pk=turn["subtask_id"])
    assert (partial_text_of(row), row.progress_events) == ("abc", [])
    # The worker sends the whole text then.
    assert post(worker_api, turn, partial_text="abcdef").status_code == 200
    assert stored(turn) == "abcdef"


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"partial_text_append": "x"}, "partial_text_offset"),
        ({"partial_text_offset": 0}, "partial_text_append"),
        (
            {"partial_text": "x", "partial_text_append": "x", "partial_text_offset": 0},
            "partial_text",
        ),
        ({"partial_text_append": "x", "partial_text_offset": -1}, "partial_text_offset"),
    ],
)
def test_an_append_needs_its_offset_and_no_whole_text(api, worker_api, body, field):
    create(api)
    [turn] = dispatch(worker_api)
    answer = post(worker_api, turn, **body)
    assert answer.status_code == 400
    assert field in answer.json()["fields"]


def test_the_stored_total_stays_within_the_message_limit(api, worker_api, settings):
    settings.BATON_MAX_MESSAGE_BYTES = 20
    create(api)
    [turn] = dispatch(worker_api)
    assert post(worker_api, turn, partial_text="é" * 8).status_code == 200  # 16 bytes
    answer = post(worker_api, turn, partial_text_append="abcde", partial_text_offset=8)
    assert answer.status_code == 413
    assert (answer.json()["code"], list(answer.json()["fields"])) == (
        "too_large",
        ["partial_text_append"],
    )
    assert (
        post(worker_api, turn, partial_text_append="abcd", partial_text_offset=8).status_code == 200
    )
    assert stored(turn) == "é" * 8 + "abcd"
    too_long = post(worker_api, turn, partial_text="x" * 21)
    assert (too_long.status_code, list(too_long.json()["fields"])) == (413, ["partial_text"])


@pytest.mark.parametrize("unstorable", ["\x00", "\ud800"])
def test_unstorable_characters_are_stored_as_in_a_whole_text(api, worker_api, unstorable):
    create(api)
    [turn] = dispatch(worker_api)
    url = f"/api/executor/subtasks/{turn['subtask_id']}/progress/"
    post(worker_api, turn, partial_text="ab")
    # JSON carries a NUL or a lone surrogate as an escape (Python's encoder writes it so); the
    # partial text shows it as U+FFFD, one code point for one, as a turn's history text does.
    for field, extra in (
        ("partial_text_append", {"partial_text_offset": 2}),
        ("partial_text", {}),
    ):
        body = {"worker_id": "w1", "attempt": 1, field: f"c{unstorable}", **extra}
        answer = worker_api.post(url, json.dumps(body), content_type="application/json")
        assert answer.status_code == 200, answer.json()
        assert answer.json()["partial_text_chars"] == 4 if field == "partial_text_append" else 2
    assert stored(turn) == "c\ufffd"


@pytest.mark.usefixtures("no_progress_grace")
def test_the_end_of_a_turn_folds_its_pieces_and_deletes_its_progress_events(api, worker_api):
    task = create(api)
    [turn] = dispatch(worker_api)
    post(worker_api, turn, partial_text="one", events=[{"type": "message"}])
    post(worker_api, turn, partial_text_append=" two", partial_text_offset=3)
    assert TaskEvent.objects.filter(task_id=task["id"], type="turn.progress").count() == 2
    assert report(worker_api, turn, result={"value": "one two three"}).status_code == 200
    row = Subtask.objects.get(pk=turn["subtask_id"])
    assert (row.partial_text, row.partial_text_chars) == ("one two", 7)
    assert not ProgressPiece.objects.filter(subtask_id=turn["subtask_id"]).exists()
    assert [event.type for event in TaskEvent.objects.filter(task_id=task["id"])] == [
        "turn.created",
        "turn.created",
        "turn.claimed",
        "turn.completed",
    ]


@pytest.mark.usefixtures("no_progress_grace")
def test_a_requeued_turn_drops_the_attempts_text_and_the_next_attempt_starts_empty(api, worker_api):
    task = create(api)
    [turn] = dispatch(worker_api)
    post(worker_api, turn, partial_text="first", events=[{"type": "message"}])
    post(worker_api, turn, partial_text_append=" try", partial_text_offset=5)
    report(worker_api, turn, status="RETRY", error="429", error_code="rate_limited")
    row = Subtask.objects.get(pk=turn["subtask_id"])
    assert (row.status, row.partial_text, row.partial_text_chars) == ("PENDING", "", 0)
    assert (row.progress_events, row.progress_updated_at) == (None, None)
    assert not ProgressPiece.objects.filter(subtask_id=turn["subtask_id"]).exists()
    assert not TaskEvent.objects.filter(task_id=task["id"], type="turn.progress").exists()
    Subtask.objects.filter(pk=turn["subtask_id"]).update(not_before=None)
    [again] = dispatch(worker_api)
    assert again["attempt"] == 2
    shown = api.get(f"/api/tasks/{task['id']}/").json()["turns"][1]
    assert (shown["partial_text"], shown["progress_events"]) == ("", None)
    # The new attempt's worker starts its text from nothing: an append at 0 is accepted.
    answer = post(worker_api, again, partial_text_append="second", partial_text_offset=0)
    assert (answer.status_code, answer.json()["partial_text_chars"]) == (200, 6)
    # A piece an earlier attempt left behind is not this attempt's text.
    ProgressPiece.objects.create(subtask_id=turn["subtask_id"], attempt=1, offset=6, text="!")
    post(worker_api, again, partial_text_append=" go", partial_text_offset=6)
    assert stored(again) == "second go"
    shown = api.get(f"/api/tasks/{task['id']}/").json()["turns"][1]
    assert shown["partial_text"] == "second go"


@pytest.mark.usefixtures("no_progress_grace")
def test_an_interrupted_turn_keeps_its_whole_partial_text_in_the_history(api, worker_api):
    task = create(api)
    [turn] = dispatch(worker_api)
    post(worker_api, turn, partial_text="Looking at")
    post(worker_api, turn, partial_text_append=" the tests", partial_text_offset=10)
    api.post(
        f"/api/tasks/{task['id']}/messages/",
        {"message": "stop", "strategy": "interrupt"},
        format="json",
    )
    row = Subtask.objects.get(pk=turn["subtask_id"])
    assert row.status == "INTERRUPTED"
    assert row.partial_text == "Looking at the tests"
    assert row.history_text.endswith("Looking at the tests")
    assert not ProgressPiece.objects.filter(subtask_id=turn["subtask_id"]).exists()
    assert not TaskEvent.objects.filter(task_id=task["id"], type="turn.progress").exists()


@pytest.mark.usefixtures("no_progress_grace")
def test_a_cancelled_turn_folds_its_pieces(api, worker_api):
    task = create(api)
    [turn] = dispatch(worker_api)
    post(worker_api, turn, partial_text="ab")
    post(worker_api, turn, partial_text_append="cd", partial_text_offset=2)
    api.post(f"/api/tasks/{task['id']}/subtasks/{turn['subtask_id']}/cancel/")
    assert Subtask.objects.get(pk=turn["subtask_id"]).partial_text == "abcd"
    assert not ProgressPiece.objects.filter(subtask_id=turn["subtask_id"]).exists()
    assert not TaskEvent.objects.filter(task_id=task["id"], type="turn.progress").exists()


# --- the worker's buffer against the API ---------------------------------------------------

TEXTS = st.text(alphabet=st.sampled_from("ab é\n🌍"), max_size=6)
# What happens to a request carrying progress: answered; lost before Baton read it; answered
# but the answer lost (the worker then knows nothing of what Baton stored); answered, the
# answer lost and the client's retry answered (an append then meets a text that already has it).
OUTCOMES = ("ok", "lost_before", "lost_after", "sent_twice")


def executor_steps(send: str) -> st.SearchStrategy[list[tuple[str, str]]]:
    """What an executor's run feeds the buffer (text deltas, a completed message replacing the
    text, a tool call), with the worker's sends (`send`, each with one of OUTCOMES) between."""
    return st.lists(
        st.one_of(
            st.tuples(st.just("delta"), TEXTS),
            st.tuples(st.just("complete"), TEXTS),
            st.tuples(st.just("tool"), st.just("")),
            st.tuples(st.just(send), st.sampled_from(OUTCOMES)),
        ),
        max_size=14,
    )


def feed(buffer: ProgressBuffer, step: str, value: str, text: str) -> str:
    """Feed the buffer an executor's step; the partial answer the executor has after it."""
    if step == "delta":
        buffer.add([MessageDelta(value)])
        return text + value
    if step == "complete":
        buffer.add([MessageCompleted(value)])
        return value
    buffer.add([ToolStarted(call_id="c", tool="shell", command="ls")])
    return text


def _sender(worker_api, turn, outcome: str):
    """A `send` for `ProgressBuffer.deliver` that posts to the API, answering as the worker's
    client would, and loses its answer or the request as `outcome` says."""

    def send(batch: ProgressBatch) -> int | None:
        if outcome == "lost_before":
            raise BackendUnavailable("no connection")
        answer = post(worker_api, turn, **batch.to_json())
        if outcome == "sent_twice":  # the answer was lost and the client sent it again
            answer = post(worker_api, turn, **batch.to_json())
        if outcome == "lost_after":
            raise BackendUnavailable("the answer was lost")
        if answer.status_code == 409:
            assert answer.json()["code"] == "partial_text_mismatch"
            raise PartialTextMismatch("409", status=409, code="partial_text_mismatch")
        assert answer.status_code == 200, answer.json()
        return answer.json()["partial_text_chars"]

    return send


@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(steps=executor_steps("post"))
def test_the_stored_text_is_what_the_buffer_last_delivered_whatever_fails(api, worker_api, steps):
    create(api)
    [turn] = dispatch(worker_api)
    buffer = ProgressBuffer()
    text = ""
    for step, value in [*steps, ("post", "ok")]:
        if step != "post":
            text = feed(buffer, step, value, text)
        else:
            batch = buffer.take(force=True)
            if batch is None:
                continue
            try:
                buffer.deliver(batch, send=_sender(worker_api, turn, value))
            except BackendUnavailable:
                continue
            # Never lost, never twice: Baton holds exactly what the buffer holds.
            assert stored(turn) == text
    last = buffer.take(force=True)
    if last is not None:
        buffer.deliver(last, send=_sender(worker_api, turn, "ok"))
    assert stored(turn) == text
    report(worker_api, turn, result={"value": text or "-"})


def test_the_schema_describes_the_append_and_both_answers(api, worker_api, client):
    document = json.loads(
        client.get("/api/schema/", HTTP_ACCEPT="application/vnd.oai.openapi+json").content
    )
    schemas = document["components"]["schemas"]
    operation = document["paths"]["/api/executor/subtasks/{subtask_id}/progress/"]["post"]

    def component(ref: dict) -> dict:
        return schemas[ref["$ref"].rsplit("/", 1)[1]]

    request = component(operation["requestBody"]["content"]["application/json"]["schema"])
    assert {"partial_text", "partial_text_append", "partial_text_offset"} <= set(
        request["properties"]
    )
    create(api)
    [turn] = dispatch(worker_api)
    for status, answer in (
        (200, post(worker_api, turn, partial_text="abc")),
        (409, post(worker_api, turn, partial_text_append="d", partial_text_offset=0)),
    ):
        assert answer.status_code == status
        shape = component(
            operation["responses"][str(status)]["content"]["application/json"]["schema"]
        )
        assert set(shape.get("required", [])) <= set(answer.json()) <= set(shape["properties"])
        assert "partial_text_chars" in answer.json()
