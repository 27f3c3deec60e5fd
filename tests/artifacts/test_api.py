"""The artifact API over HTTP: metadata, whole and sliced content, caching, access, integrity."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from django.http import StreamingHttpResponse
from rest_framework.test import APIClient

from backend.artifacts import selectors
from backend.artifacts.models import Artifact
from backend.tasks.models import Task
from tests.artifacts.conftest import LINE_COUNT, SPILLED_LINES, SPILLED_TEXT, spill

pytestmark = pytest.mark.django_db

BODY = SPILLED_TEXT.encode("utf-8")
SIZE = len(BODY)
TOTAL_LINES = LINE_COUNT + 1


def content_url(artifact_id: str) -> str:
    return f"/api/artifacts/{artifact_id}/content/"


def body_of(response) -> bytes:
    assert isinstance(response, StreamingHttpResponse)
    return b"".join(response.streaming_content)


def lines_text(first: int, last: int) -> bytes:
    """Lines first..last (1-based) of SPILLED_TEXT, newlines kept, as UTF-8."""
    with_newlines = [line + "\n" for line in SPILLED_LINES[:-1]] + [SPILLED_LINES[-1]]
    return "".join(with_newlines[first - 1 : last]).encode("utf-8")


def assert_error(response, status: int, code: str) -> dict:
    assert response.status_code == status
    assert response["Content-Type"].startswith("application/json")
    body = response.json()
    assert body["code"] == code, body
    return body


# --- metadata --------------------------------------------------------------------------------


def test_metadata(api: APIClient, artifact: Artifact) -> None:
    response = api.get(f"/api/artifacts/{artifact.id}/")
    assert response.status_code == 200
    body = response.json()
    assert body == {
        "id": artifact.id,
        "sha256": artifact.sha256,
        "kind": artifact.kind,
        "size_bytes": SIZE,
        "size_chars": len(SPILLED_TEXT),
        "size_lines": TOTAL_LINES,
        "path": f".baton/artifacts/{artifact.id}.txt",
        "download_url": f"http://testserver/api/artifacts/{artifact.id}/content/",
        "task": artifact.task_id,
        "created_at": body["created_at"],
        "last_read_at": None,
    }
    assert body["created_at"]


def test_metadata_of_a_shared_text_tells_each_owner_only_about_their_own_tasks(
    api: APIClient, other_api: APIClient, artifact: Artifact, other_user
) -> None:
    """B sends the text A sent: one artifact, but B learns nothing of A's task or reads."""
    assert body_of(api.get(content_url(artifact.id))) == BODY  # A reads it: last_read_at is set
    own = spill(owner=other_user, title="B's copy")
    assert own.id == artifact.id
    b_task = Task.objects.get(owner=other_user)
    body = other_api.get(f"/api/artifacts/{artifact.id}/").json()
    assert body["task"] == b_task.pk != artifact.task_id
    assert body["last_read_at"] is None
    b_turn = b_task.subtasks.get(artifact_id=artifact.id)
    assert body["created_at"] == b_turn.created_at.isoformat().replace("+00:00", "Z")
    a_view = api.get(f"/api/artifacts/{artifact.id}/").json()
    assert a_view["task"] == artifact.task_id and a_view["last_read_at"] is not None


def test_metadata_of_unknown_artifact_is_404(api: APIClient) -> None:
    body = assert_error(api.get("/api/artifacts/0123456789abcdef/"), 404, "not_found")
    assert "0123456789abcdef" in body["detail"]


# --- whole content ---------------------------------------------------------------------------


def test_full_content_is_streamed_with_validators(api: APIClient, artifact: Artifact) -> None:
    response = api.get(content_url(artifact.id))
    assert response.status_code == 200
    assert response["Content-Type"] == "text/plain; charset=utf-8"
    assert response["Content-Length"] == str(SIZE)
    assert response["ETag"] == f'"{artifact.sha256}"'
    assert response["Accept-Ranges"] == "bytes"
    assert "Content-Range" not in response
    assert body_of(response) == BODY


def test_content_ignores_an_accept_header_that_asks_for_text(
    api: APIClient, artifact: Artifact
) -> None:
    response = api.get(content_url(artifact.id), HTTP_ACCEPT="text/plain")
    assert response.status_code == 200
    assert body_of(response) == BODY
    # Errors stay JSON even then.
    missing = api.get(content_url("0123456789abcdef"), HTTP_ACCEPT="text/plain")
    assert_error(missing, 404, "not_found")


def test_each_content_read_stamps_last_read_at(api: APIClient, artifact: Artifact) -> None:
    assert artifact.last_read_at is None
    body_of(api.get(content_url(artifact.id)))
    artifact.refresh_from_db()
    first_read = artifact.last_read_at
    assert first_read is not None
    body_of(api.get(content_url(artifact.id), {"lines": "1-2"}))
    artifact.refresh_from_db()
    assert artifact.last_read_at >= first_read


def test_metadata_read_does_not_stamp_last_read_at(api: APIClient, artifact: Artifact) -> None:
    api.get(f"/api/artifacts/{artifact.id}/")
    artifact.refresh_from_db()
    assert artifact.last_read_at is None


# --- byte ranges -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("header", "start", "end"),
    [
        ("bytes=0-9", 0, 10),
        ("bytes=100-199", 100, 200),
        ("bytes=7-7", 7, 8),
        (f"bytes=100-{SIZE * 10}", 100, SIZE),  # the end is clamped to the last byte
        ("bytes=1000-", 1000, SIZE),
        (f"bytes={SIZE - 1}-", SIZE - 1, SIZE),
        ("bytes=-10", SIZE - 10, SIZE),
        (f"bytes=-{SIZE * 2}", 0, SIZE),  # a suffix longer than the content is all of it
        ("BYTES= 0-9 ", 0, 10),  # the unit is case-insensitive; whitespace is allowed
    ],
)
def test_single_byte_range(api: APIClient, artifact: Artifact, header, start, end) -> None:
    response = api.get(content_url(artifact.id), HTTP_RANGE=header)
    assert response.status_code == 206
    assert response["Content-Range"] == f"bytes {start}-{end - 1}/{SIZE}"
    assert response["Content-Length"] == str(end - start)
    assert response["ETag"] == f'"{artifact.sha256}"'
    assert body_of(response) == BODY[start:end]


@pytest.mark.parametrize("header", [f"bytes={SIZE}-", f"bytes={SIZE + 5}-{SIZE + 10}", "bytes=-0"])
def test_unsatisfiable_byte_range_is_416(api: APIClient, artifact: Artifact, header) -> None:
    response = api.get(content_url(artifact.id), HTTP_RANGE=header)
    assert_error(response, 416, "range_not_satisfiable")
    assert response["Content-Range"] == f"bytes */{SIZE}"


@pytest.mark.parametrize(
    "header",
    [
        "bytes=abc",
        "bytes=10-5",  # last before first: invalid, so ignored
        "bytes=-",
        "bytes=0-9,20-29",  # several ranges: Baton serves one range only
        "items=0-9",
        "0-9",
        "",
    ],
)
def test_malformed_range_is_ignored(api: APIClient, artifact: Artifact, header) -> None:
    response = api.get(content_url(artifact.id), HTTP_RANGE=header)
    assert response.status_code == 200
    assert "Content-Range" not in response
    assert response["Content-Length"] == str(SIZE)
    assert body_of(response) == BODY


def test_if_range_with_the_current_etag_honours_the_range(
    api: APIClient, artifact: Artifact
) -> None:
    response = api.get(
        content_url(artifact.id), HTTP_RANGE="bytes=0-4", HTTP_IF_RANGE=f'"{artifact.sha256}"'
    )
    assert response.status_code == 206
    assert body_of(response) == BODY[:5]


def test_if_range_with_another_validator_sends_everything(
    api: APIClient, artifact: Artifact
) -> None:
    for if_range in ('"0000"', f'W/"{artifact.sha256}"', "Tue, 15 Nov 1994 08:12:31 GMT"):
        response = api.get(content_url(artifact.id), HTTP_RANGE="bytes=0-4", HTTP_IF_RANGE=if_range)
        assert response.status_code == 200
        assert body_of(response) == BODY


# --- line slices -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("lines", "first", "last"),
    [
        ("1-1", 1, 1),
        ("2-4", 2, 4),
        ("1-", 1, TOTAL_LINES),
        (f"{LINE_COUNT}-{LINE_COUNT}", LINE_COUNT, LINE_COUNT),
        # The last line has no trailing newline; it is a line all the same.
        (f"{TOTAL_LINES}-{TOTAL_LINES}", TOTAL_LINES, TOTAL_LINES),
        (f"{TOTAL_LINES}-", TOTAL_LINES, TOTAL_LINES),
        (f"{LINE_COUNT - 1}-{TOTAL_LINES + 50}", LINE_COUNT - 1, TOTAL_LINES),  # END is clamped
        ("500-600", 500, 600),
    ],
)
def test_line_slice(api: APIClient, artifact: Artifact, lines, first, last) -> None:
    response = api.get(content_url(artifact.id), {"lines": lines})
    assert response.status_code == 200
    expected = lines_text(first, last)
    assert response["Content-Length"] == str(len(expected))
    assert response["X-Baton-Lines"] == f"{first}-{last}/{TOTAL_LINES}"
    assert response["ETag"] == f'"{artifact.sha256}"'
    body = body_of(response)
    assert body == expected
    body.decode("utf-8")  # slices fall on newlines, so no multibyte character is split


def test_line_slices_of_the_last_line_without_trailing_newline(
    api: APIClient, artifact: Artifact
) -> None:
    response = api.get(content_url(artifact.id), {"lines": f"{TOTAL_LINES}-"})
    assert body_of(response).decode("utf-8") == "last line 😀 without newline"


def test_line_slices_of_text_that_ends_with_a_newline(user, api: APIClient) -> None:
    text = "".join(f"ligne {number} – ü\n" for number in range(1, 2_001))
    artifact = spill(owner=user, text=text)
    assert artifact.size_lines == 2_000

    response = api.get(content_url(artifact.id), {"lines": "1999-"})
    assert body_of(response).decode("utf-8") == "ligne 1999 – ü\nligne 2000 – ü\n"
    assert response["X-Baton-Lines"] == "1999-2000/2000"
    assert_error(
        api.get(content_url(artifact.id), {"lines": "2001-"}), 416, "lines_not_satisfiable"
    )


@pytest.mark.parametrize("lines", [f"{TOTAL_LINES + 1}-", f"{TOTAL_LINES + 1}-{TOTAL_LINES + 9}"])
def test_line_slice_starting_after_the_end_is_416(
    api: APIClient, artifact: Artifact, lines
) -> None:
    body = assert_error(
        api.get(content_url(artifact.id), {"lines": lines}), 416, "lines_not_satisfiable"
    )
    assert "lines" in body["fields"]
    assert str(TOTAL_LINES) in body["detail"]


@pytest.mark.parametrize("lines", ["", "abc", "0-3", "3-2", "1-2-3", "-5", "1:5", "1.5-2", "1-x"])
def test_invalid_lines_is_400_naming_lines(api: APIClient, artifact: Artifact, lines) -> None:
    body = assert_error(api.get(content_url(artifact.id), {"lines": lines}), 400, "invalid")
    assert list(body["fields"]) == ["lines"]


def test_unknown_query_parameter_is_400(api: APIClient, artifact: Artifact) -> None:
    body = assert_error(api.get(content_url(artifact.id), {"line": "1-2"}), 400, "invalid")
    assert list(body["fields"]) == ["line"]


def test_lines_with_a_range_header_is_400(api: APIClient, artifact: Artifact) -> None:
    response = api.get(content_url(artifact.id), {"lines": "1-2"}, HTTP_RANGE="bytes=0-9")
    body = assert_error(response, 400, "invalid")
    assert list(body["fields"]) == ["lines"]


# --- conditional requests --------------------------------------------------------------------


@pytest.mark.parametrize("if_none_match", ['"{sha}"', 'W/"{sha}"', '"0000", "{sha}"', "*"], ids=str)
def test_if_none_match_with_the_etag_is_304(
    api: APIClient, artifact: Artifact, if_none_match
) -> None:
    header = if_none_match.format(sha=artifact.sha256)
    response = api.get(content_url(artifact.id), HTTP_IF_NONE_MATCH=header)
    assert response.status_code == 304
    assert response["ETag"] == f'"{artifact.sha256}"'
    assert response.content == b""


def test_if_none_match_with_another_etag_sends_the_content(
    api: APIClient, artifact: Artifact
) -> None:
    response = api.get(content_url(artifact.id), HTTP_IF_NONE_MATCH='"0000"')
    assert response.status_code == 200
    assert body_of(response) == BODY


# --- who may read ----------------------------------------------------------------------------


def test_unknown_artifact_content_is_404(api: APIClient) -> None:
    assert_error(api.get(content_url("0123456789abcdef")), 404, "not_found")
    assert_error(api.get(content_url("not-an-id")), 404, "not_found")


def test_another_users_artifact_is_404(other_api: APIClient, artifact: Artifact) -> None:
    assert_error(other_api.get(content_url(artifact.id)), 404, "not_found")
    assert_error(other_api.get(f"/api/artifacts/{artifact.id}/"), 404, "not_found")
    artifact.refresh_from_db()
    assert artifact.last_read_at is None


def test_staff_read_any_artifact(staff_api: APIClient, artifact: Artifact) -> None:
    assert staff_api.get(f"/api/artifacts/{artifact.id}/").status_code == 200
    response = staff_api.get(content_url(artifact.id))
    assert response.status_code == 200
    assert body_of(response) == BODY


def test_a_turn_referencing_the_artifact_grants_access(
    other_user, other_api: APIClient, artifact: Artifact
) -> None:
    """The same text recorded in another user's task shares the artifact; both may read it."""
    assert spill(owner=other_user, text=SPILLED_TEXT) == artifact
    response = other_api.get(content_url(artifact.id))
    assert response.status_code == 200
    assert body_of(response) == BODY


def test_unauthenticated_is_401(artifact: Artifact) -> None:
    client = APIClient()
    assert_error(client.get(content_url(artifact.id)), 401, "not_authenticated")
    assert_error(client.get(f"/api/artifacts/{artifact.id}/"), 401, "not_authenticated")
    bad_token = APIClient()
    bad_token.credentials(HTTP_AUTHORIZATION="Token not-a-real-token")
    assert_error(bad_token.get(content_url(artifact.id)), 401, "authentication_failed")


def test_session_login_reads_content(client, user, artifact: Artifact) -> None:
    client.force_login(user)
    response = client.get(content_url(artifact.id))
    assert response.status_code == 200
    assert body_of(response) == BODY


# --- integrity -------------------------------------------------------------------------------


def stored_file(storage_dir: Path, artifact: Artifact) -> Path:
    return storage_dir / artifact.storage_key


@pytest.mark.parametrize(
    "request_kwargs",
    [{}, {"HTTP_RANGE": "bytes=0-9"}, {"data": {"lines": "1-2"}}],
    ids=["whole", "range", "lines"],
)
def test_corrupted_content_is_500_without_content_bytes(
    api: APIClient, artifact: Artifact, artifact_storage_in_tmp, caplog, request_kwargs
) -> None:
    path = stored_file(artifact_storage_in_tmp, artifact)
    damaged = bytearray(path.read_bytes())
    damaged[5:9] = b"XXXX"  # same size, different bytes
    path.write_bytes(bytes(damaged))

    with caplog.at_level(logging.ERROR):
        response = api.get(content_url(artifact.id), **request_kwargs)
    body = assert_error(response, 500, "artifact_integrity")
    assert artifact.id in body["detail"]
    assert "sha256" in body["detail"]
    assert b"line 0001" not in response.content and b"XXXX" not in response.content
    logged = [
        record.getMessage() for record in caplog.records if artifact.id in record.getMessage()
    ]
    assert logged, "the failure is logged with the artifact id"
    assert all("héllo" not in message and "XXXX" not in message for message in logged)
    artifact.refresh_from_db()
    assert artifact.last_read_at is None


def test_missing_content_is_500(
    api: APIClient, artifact: Artifact, artifact_storage_in_tmp, caplog
) -> None:
    stored_file(artifact_storage_in_tmp, artifact).unlink()
    with caplog.at_level(logging.ERROR):
        response = api.get(content_url(artifact.id))
    body = assert_error(response, 500, "artifact_integrity")
    assert artifact.id in body["detail"]
    assert "missing" in body["detail"]
    assert any(artifact.id in record.getMessage() for record in caplog.records)


def test_truncated_content_is_500(api: APIClient, artifact: Artifact, artifact_storage_in_tmp):
    path = stored_file(artifact_storage_in_tmp, artifact)
    path.write_bytes(path.read_bytes()[:100])
    assert_error(
        api.get(content_url(artifact.id), HTTP_RANGE="bytes=0-9"), 500, "artifact_integrity"
    )


def test_a_damaged_result_value_leaves_the_task_api_up(
    api: APIClient, artifact: Artifact, artifact_storage_in_tmp
) -> None:
    """The task API shows a long result's preview without reading its artifact; the turn's
    whole text is the same artifact_integrity error as the content endpoint gives."""
    path = stored_file(artifact_storage_in_tmp, artifact)
    path.write_bytes(path.read_bytes()[:100])
    response = api.get(f"/api/tasks/{artifact.task_id}/")
    assert response.status_code == 200
    value = response.json()["turns"][1]["result"]["value"]
    assert value["artifact"]["id"] == artifact.id
    body = assert_error(api.get(value["url"]), 500, "artifact_integrity")
    assert artifact.id in body["detail"]


# --- resources -------------------------------------------------------------------------------


def test_an_unread_response_closes_its_stored_file_when_closed(
    api: APIClient, artifact: Artifact, opened_files: list
) -> None:
    """A client that drops the connection never iterates the body; the server still closes the
    response, and that closes the stored file (no file is left for the garbage collector)."""
    response = api.get(content_url(artifact.id))
    assert response.status_code == 200
    [stored] = opened_files
    assert not stored.closed
    response.close()
    assert stored.closed


# --- chunk boundaries ------------------------------------------------------------------------


@pytest.mark.parametrize("chunk_bytes", [1, 7, 29, 4096])
def test_slices_are_exact_whatever_the_read_chunk_size(
    api: APIClient, artifact: Artifact, monkeypatch, chunk_bytes
) -> None:
    """Newlines that fall on chunk edges, or many per chunk, give the same slices."""
    monkeypatch.setattr(selectors, "READ_CHUNK_BYTES", chunk_bytes)
    for first, last in [(1, 1), (1, 3), (2, 2), (17, 250), (LINE_COUNT, TOTAL_LINES)]:
        response = api.get(content_url(artifact.id), {"lines": f"{first}-{last}"})
        chunks = list(response.streaming_content)
        assert b"".join(chunks) == lines_text(first, last)
        assert max(len(chunk) for chunk in chunks) <= chunk_bytes
    response = api.get(content_url(artifact.id), HTTP_RANGE="bytes=5-4000")
    assert b"".join(response.streaming_content) == BODY[5:4001]
    response = api.get(content_url(artifact.id))
    chunks = list(response.streaming_content)
    assert b"".join(chunks) == BODY
    assert len(chunks) == -(-SIZE // chunk_bytes)  # streamed in chunks, never read whole
