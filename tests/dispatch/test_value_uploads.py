"""A result's value uploaded as a stream, then named by the report, over HTTP: the turn is
recorded exactly as the same report with the value inline records it, fenced and idempotent
the same way, and nothing is left of an upload that is refused or fails."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import pytest

from backend.api import body_limits
from backend.artifacts.models import Artifact
from backend.artifacts.storage import artifact_storage, content_address
from backend.prompting import previews
from backend.tasks.models import Subtask, Task
from backend.tasks.selectors import turn_result
from tests.conftest import make_worker, token_client
from tests.dispatch.test_dispatch_api import create, dispatch, report
from tests.dispatch.test_lease_loss import expire

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("pipeline_bots")]

TEXT_PLAIN = "text/plain; charset=utf-8"
# Over the 16,000-char spill threshold: a test run whose evidence (the failure, the exit code)
# lies in its middle and at its end, multibyte characters on every line, no final line break.
TEST_LOG = (
    "$ pytest -q\n"
    + "".join(f"tests/test_{n:04d}.py ✓ passed in 0.{n:03d}s\n" for n in range(600))
    + "E   AssertionError: expected 3, got 4 — ünïcode\n"
    + "".join(f"tests/test_more_{n:04d}.py ✓ passed\n" for n in range(600))
    + "1 failed, 1199 passed in 3.2s\nexit code 1 😀"
)
# The turn's columns that recording a result fills in.
RECORDED_FIELDS = (
    "status",
    "result",
    "result_value_in_artifact",
    "error",
    "error_code",
    "usage",
    "native_session_id",
    "history_text",
    "history_text_tokens",
    "preview_head",
    "preview_tail",
    "preview_layout",
    "history_chars",
    "history_bytes",
    "history_lines",
    "history_tokens",
    "history_tokens_estimated",
    "history_replaced_chars",
    "history_is_preview",
    "artifact_id",
)
ARTIFACT_FIELDS = ("id", "sha256", "storage_key", "size_chars", "size_bytes", "size_lines", "kind")


def value_url(turn: dict, *, worker_id: str = "w1", attempt: int | None = None) -> str:
    attempt = turn["attempt"] if attempt is None else attempt
    return (
        f"/api/executor/subtasks/{turn['subtask_id']}/result/value/"
        f"?worker_id={worker_id}&attempt={attempt}"
    )


def upload(client, turn: dict, body: bytes | str, **kwargs: Any):
    data = body.encode() if isinstance(body, str) else body
    return client.put(value_url(turn, **kwargs), data, content_type=TEXT_PLAIN)


def upload_sha(client, turn: dict, text: str, **kwargs: Any) -> str:
    response = upload(client, turn, text, **kwargs)
    assert response.status_code == 200, response.json()
    return str(response.json()["value_upload"])


def stored_files(root: Path) -> list[Path]:
    return sorted(path for path in root.rglob("*") if path.is_file())


def recorded(subtask_id: int) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """The turn's recorded columns and its artifact's, and the result it reads back as."""
    turn = Subtask.objects.select_related("artifact").get(pk=subtask_id)
    fields = {name: getattr(turn, name) for name in RECORDED_FIELDS}
    fields["result_read_back"] = turn_result(subtask=turn)
    artifact = (
        None
        if turn.artifact is None
        else {name: getattr(turn.artifact, name) for name in ARTIFACT_FIELDS}
    )
    return fields, artifact


def forget_everything() -> None:
    """No task, no artifact and no stored file: the next recording starts from nothing."""
    Task.objects.all().delete()
    Artifact.objects.all().delete()
    for path in stored_files(Path(artifact_storage().location)):
        path.unlink()


# --- the same turn as inline -----------------------------------------------------------------


def long_json() -> str:
    return json.dumps({"items": [{"id": n, "name": f"item {n} ✓"} for n in range(900)]})


@pytest.mark.parametrize(
    "value",
    [
        pytest.param(TEST_LOG, id="spilled command output"),
        pytest.param(long_json(), id="spilled json"),
        pytest.param("All green ✓\nexit code 0", id="within the spill threshold"),
        pytest.param("", id="empty"),
    ],
)
def test_an_uploaded_value_records_the_turn_the_inline_value_does(api, worker_api, value):
    others = {"commands": ["pytest -q"], "files_changed": ["src/app.py"]}
    usage = {"input_tokens": 10, "output_tokens": 2}
    create(api)
    [turn] = dispatch(worker_api)
    inline = report(
        worker_api, turn, result={"value": value, **others}, usage=usage, native_session_id="s1"
    )
    assert inline.status_code == 200, inline.json()
    expected, expected_artifact = recorded(turn["subtask_id"])
    forget_everything()

    task = create(api)
    [turn] = dispatch(worker_api)
    uploaded = upload(worker_api, turn, value)
    assert uploaded.status_code == 200, uploaded.json()
    assert uploaded.json() == {
        "value_upload": content_address(value).sha256,
        "artifact_id": content_address(value).sha256[:16],
        "size_chars": len(value),
        "size_bytes": len(value.encode()),
        "size_lines": expected["history_lines"],
    }
    answer = report(
        worker_api,
        turn,
        result=others,
        usage=usage,
        native_session_id="s1",
        value_upload=uploaded.json()["value_upload"],
    )
    assert answer.status_code == 200, answer.json()
    assert (answer.json()["status"], answer.json()["changed"]) == ("COMPLETED", True)
    actual, actual_artifact = recorded(turn["subtask_id"])
    assert actual == expected
    assert actual["result_read_back"] == {"value": value, **others}
    if expected_artifact is None:
        return
    assert actual_artifact == expected_artifact
    artifact = Artifact.objects.get()
    assert artifact.task_id == task["id"]
    with artifact_storage().open(artifact.storage_key, "rb") as stored:
        assert stored.read() == value.encode()


def test_a_value_too_long_to_scan_is_previewed_from_its_ends_either_way(
    api, worker_api, monkeypatch
):
    """Past the preview's scan bound (here made small), evidence is looked for only at the two
    ends, whether the value came inline or uploaded, so both record the same preview."""
    monkeypatch.setattr(previews, "PREVIEW_SCAN_MAX_CHARS", 20_000)
    filler = "".join(f"step {n:05d} ok ✓\n" for n in range(4_000))
    log = (
        "$ make all\nerror: near the start\n"
        + filler
        + "error: in the middle\n"
        + filler
        + "FAILED near the end\nexit code 2\n"
    )
    create(api)
    [turn] = dispatch(worker_api)
    assert report(worker_api, turn, result={"value": log}).status_code == 200
    expected, expected_artifact = recorded(turn["subtask_id"])
    assert "error: near the start" in expected["history_text"]
    assert "FAILED near the end" in expected["history_text"]
    assert "in the middle" not in expected["history_text"]
    forget_everything()

    create(api)
    [turn] = dispatch(worker_api)
    sha = upload_sha(worker_api, turn, log)
    assert report(worker_api, turn, result={}, value_upload=sha).status_code == 200
    assert recorded(turn["subtask_id"]) == (expected, expected_artifact)


def test_a_utf8_sequence_split_between_two_read_chunks_is_one_character(api, worker_api):
    value = "a" * ((1 << 20) - 2) + "😀" + "b" * 20_000  # the emoji straddles the first 1 MiB
    create(api)
    [turn] = dispatch(worker_api)
    answer = upload(worker_api, turn, value)
    assert answer.status_code == 200, answer.json()
    assert (answer.json()["size_chars"], answer.json()["size_bytes"]) == (
        len(value),
        len(value.encode()),
    )


# --- idempotent ------------------------------------------------------------------------------


def test_uploading_and_reporting_again_changes_nothing(api, worker_api, artifact_storage_in_tmp):
    create(api)
    [turn] = dispatch(worker_api)
    sha = upload_sha(worker_api, turn, TEST_LOG)
    assert upload_sha(worker_api, turn, TEST_LOG) == sha  # the same text: nothing new
    assert Artifact.objects.count() == 1
    assert len(stored_files(artifact_storage_in_tmp)) == 1
    different = upload_sha(worker_api, turn, TEST_LOG + "\nmore")

    first = report(worker_api, turn, result={"commands": ["make"]}, value_upload=sha)
    assert first.json()["changed"] is True
    state = recorded(turn["subtask_id"])
    again = report(worker_api, turn, result={"commands": ["make"]}, value_upload=sha)
    assert (again.status_code, again.json()["changed"]) == (200, False)
    # The same result with its value inline is the same report too.
    inline = report(worker_api, turn, result={"value": TEST_LOG, "commands": ["make"]})
    assert (inline.status_code, inline.json()["changed"]) == (200, False)
    assert recorded(turn["subtask_id"]) == state

    other = report(worker_api, turn, result={"commands": ["make -j"]}, value_upload=sha)
    assert (other.status_code, other.json()["code"]) == (409, "conflict")
    refused = report(worker_api, turn, result={"commands": ["make"]}, value_upload=different)
    assert (refused.status_code, refused.json()["code"]) == (409, "conflict")
    assert recorded(turn["subtask_id"]) == state
    # The claim reported the turn: it has nothing more to upload.
    late = upload(worker_api, turn, "an afterthought")
    assert (late.status_code, late.json()["code"]) == (409, "lease_lost")
    assert "this claim already reported the turn COMPLETED" in late.json()["detail"]
    assert Artifact.objects.count() == 2


# --- fenced ----------------------------------------------------------------------------------


class UnreadBody:
    """A request body stream that fails the test if anything reads it."""

    def read(self, *args: Any) -> bytes:
        raise AssertionError("the request body was read")

    readline = read


def unread_upload(client, turn: dict, *, worker_id: str = "w1"):
    return client.generic(
        "PUT",
        value_url(turn, worker_id=worker_id),
        content_type=TEXT_PLAIN,
        CONTENT_LENGTH="1000",
        **{"wsgi.input": UnreadBody()},
    )


def test_a_claim_whose_lease_is_lost_is_refused_before_its_body_is_read(
    api, worker_api, artifact_storage_in_tmp
):
    create(api)
    [turn] = dispatch(worker_api)
    expire(turn)
    refused = unread_upload(worker_api, turn)
    assert (refused.status_code, refused.json()["code"]) == (409, "lease_lost")
    assert "the lease expired; Baton requeued the turn" in refused.json()["detail"]
    assert Subtask.objects.get(pk=turn["subtask_id"]).status == "PENDING"  # reclaimed
    assert not Artifact.objects.exists()
    assert stored_files(artifact_storage_in_tmp) == []


def test_another_workers_claim_is_404_or_lease_lost_as_for_reports(
    api, worker_api, other_worker_api
):
    create(api)
    [turn] = dispatch(worker_api)
    stranger = unread_upload(other_worker_api, turn, worker_id="w2")
    assert (stranger.status_code, stranger.json()["code"]) == (404, "not_found")
    wrong_attempt = upload(worker_api, turn, TEST_LOG, attempt=turn["attempt"] + 1)
    assert (wrong_attempt.status_code, wrong_attempt.json()["code"]) == (409, "lease_lost")
    expire(turn)
    [again] = dispatch(other_worker_api, worker_id="w2")
    late = upload(worker_api, turn, TEST_LOG)
    assert (late.status_code, late.json()["code"]) == (409, "lease_lost")
    assert "attempt 2 of another worker account holds the turn now" in late.json()["detail"]
    assert not Artifact.objects.exists()
    # The claim that holds the turn uploads and reports.
    sha = upload_sha(other_worker_api, again, TEST_LOG, worker_id="w2")
    done = report(other_worker_api, again, worker_id="w2", result={}, value_upload=sha)
    assert done.status_code == 200, done.json()
    # The first claim cannot record the upload the new one made.
    late_report = report(worker_api, turn, result={}, value_upload=sha)
    assert (late_report.status_code, late_report.json()["code"]) == (409, "lease_lost")
    third = token_client(make_worker("worker-3"))
    assert report(third, turn, result={}, value_upload=sha).status_code == 404


# --- refused uploads -------------------------------------------------------------------------


def test_bytes_that_are_not_utf8_are_refused_naming_the_value(
    api, worker_api, artifact_storage_in_tmp
):
    create(api)
    [turn] = dispatch(worker_api)
    answer = upload(worker_api, turn, "ok ✓\n".encode() + b"\xff\xfe tail")
    assert answer.status_code == 400
    detail = "value is not valid UTF-8 (byte 7: invalid start byte)."
    assert answer.json() == {"detail": detail, "code": "invalid", "fields": {"value": [detail]}}
    cut = upload(worker_api, turn, "ends inside a character ✓".encode()[:-1])
    assert cut.status_code == 400
    assert cut.json()["detail"].startswith("value is not valid UTF-8 (byte 24: ")
    assert not Artifact.objects.exists()
    assert stored_files(artifact_storage_in_tmp) == []
    assert Subtask.objects.get(pk=turn["subtask_id"]).status == "RUNNING"


def test_a_value_with_nul_is_refused_for_the_inline_report(api, worker_api):
    create(api)
    [turn] = dispatch(worker_api)
    answer = upload(worker_api, turn, "before\x00after")
    assert answer.status_code == 400
    assert answer.json()["fields"]["value"][0].startswith("value holds 1 NUL characters")
    assert not Artifact.objects.exists()


def test_a_body_that_is_not_utf8_text_is_415(api, worker_api):
    create(api)
    [turn] = dispatch(worker_api)
    for content_type in ("application/json", "text/plain; charset=latin-1"):
        answer = worker_api.put(value_url(turn), b'"x"', content_type=content_type)
        assert (answer.status_code, answer.json()["code"]) == (415, "unsupported_media_type")
    plain = worker_api.put(value_url(turn), b"x", content_type="text/plain")
    assert plain.status_code == 200, plain.json()


def test_the_claim_must_be_named_in_the_query(api, worker_api):
    create(api)
    [turn] = dispatch(worker_api)
    path = f"/api/executor/subtasks/{turn['subtask_id']}/result/value/?worker_id=w1"
    answer = worker_api.put(path, b"x", content_type=TEXT_PLAIN)
    assert answer.status_code == 400
    assert set(answer.json()["fields"]) == {"attempt"}


def test_a_value_over_the_result_limit_is_413_unread(api, worker_api, settings):
    settings.BATON_MAX_RESULT_BYTES = 5_000
    create(api)
    [turn] = dispatch(worker_api)
    answer = worker_api.generic(
        "PUT",
        value_url(turn),
        content_type=TEXT_PLAIN,
        CONTENT_LENGTH="5001",
        **{"wsgi.input": UnreadBody()},
    )
    assert answer.status_code == 413
    path = f"/api/executor/subtasks/{turn['subtask_id']}/result/value/"
    detail = (
        f"The request body is 5001 bytes; PUT {path} accepts at most 5000 bytes "
        "(value: at most 5000 bytes of UTF-8, BATON_MAX_RESULT_BYTES)."
    )
    assert answer.json() == {"detail": detail, "code": "too_large", "fields": {"value": [detail]}}
    assert body_limits.RESULT_VALUE.size() == 5_000
    exactly = upload(worker_api, turn, "x" * 5_000)
    assert exactly.status_code == 200, exactly.json()


def test_a_chunked_value_over_the_limit_is_413_after_one_byte_more(api, worker_api, settings):
    settings.BATON_MAX_RESULT_BYTES = 5_000
    create(api)
    [turn] = dispatch(worker_api)
    stream = io.BytesIO(b"x" * 50_000)
    answer = worker_api.generic(
        "PUT",
        value_url(turn),
        content_type=TEXT_PLAIN,
        HTTP_TRANSFER_ENCODING="chunked",
        **{"wsgi.input": stream, "wsgi.input_terminated": True},
    )
    assert (answer.status_code, answer.json()["code"]) == (413, "too_large")
    assert answer.json()["fields"] == {"value": [answer.json()["detail"]]}
    assert stream.tell() == 5_001
    assert not Artifact.objects.exists()
    within = worker_api.generic(
        "PUT",
        value_url(turn),
        content_type=TEXT_PLAIN,
        HTTP_TRANSFER_ENCODING="chunked",
        **{"wsgi.input": io.BytesIO(b"y" * 5_000), "wsgi.input_terminated": True},
    )
    assert within.status_code == 200, within.json()
    assert within.json()["size_bytes"] == 5_000


def test_a_value_uploaded_before_the_limit_was_lowered_is_413_at_the_report(
    api, worker_api, settings
):
    create(api)
    [turn] = dispatch(worker_api)
    sha = upload_sha(worker_api, turn, TEST_LOG)
    settings.BATON_MAX_RESULT_BYTES = 1_000
    answer = report(worker_api, turn, result={}, value_upload=sha)
    assert answer.status_code == 413
    assert answer.json()["fields"] == {"result": [answer.json()["detail"]]}
    assert Subtask.objects.get(pk=turn["subtask_id"]).status == "RUNNING"


# --- reports that name an upload -------------------------------------------------------------


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"status": "FAILED", "error": "boom"}, "value_upload"),
        ({"status": "RETRY", "error": "boom"}, "value_upload"),
        ({"result": {"value": "inline too"}}, "result"),
        ({"result": ["not", "an", "object"]}, "result"),
    ],
)
def test_a_report_that_cannot_name_an_upload_is_400(api, worker_api, body, field):
    create(api)
    [turn] = dispatch(worker_api)
    sha = upload_sha(worker_api, turn, TEST_LOG)
    answer = report(worker_api, turn, **{"value_upload": sha, **body})
    assert answer.status_code == 400, answer.json()
    assert set(answer.json()["fields"]) == {field}
    assert Subtask.objects.get(pk=turn["subtask_id"]).status == "RUNNING"


def test_a_report_naming_an_upload_baton_lacks_is_409_and_succeeds_after_a_new_upload(
    api, worker_api, artifact_storage_in_tmp
):
    create(api)
    [turn] = dispatch(worker_api)
    unknown = report(worker_api, turn, result={}, value_upload="0" * 64)
    assert (unknown.status_code, unknown.json()["code"]) == (409, "upload_missing")
    assert set(unknown.json()["fields"]) == {"value_upload"}
    sha = upload_sha(worker_api, turn, TEST_LOG)
    [file] = stored_files(artifact_storage_in_tmp)
    file.write_bytes(b"damaged")
    damaged = report(worker_api, turn, result={}, value_upload=sha)
    assert (damaged.status_code, damaged.json()["code"]) == (409, "upload_missing")
    assert Subtask.objects.get(pk=turn["subtask_id"]).status == "RUNNING"
    assert upload_sha(worker_api, turn, TEST_LOG) == sha  # mends the stored copy
    assert file.read_bytes() == TEST_LOG.encode()
    assert report(worker_api, turn, result={}, value_upload=sha).status_code == 200
