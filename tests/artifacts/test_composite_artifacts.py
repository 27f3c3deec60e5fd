"""Composite artifacts on the server: served over HTTP as their parts' bytes in order (whole,
by byte range, by lines, across part boundaries), refused when a part is damaged or is not one
the composite was made of, readable part by part by whoever may read the task's history files,
and pruned without ever losing a part a live composite or a sealed transcript part needs.
"""

from __future__ import annotations

import logging
from datetime import timedelta
from pathlib import Path

import pytest
from django.contrib.auth import get_user_model
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext
from django.utils import timezone
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from rest_framework.test import APIClient

from backend.artifacts import retention, selectors
from backend.artifacts.models import Artifact, ArtifactPart
from backend.artifacts.retention import PrunedArtifact
from backend.artifacts.services import (
    ArtifactText,
    atomic_storing_artifacts,
    composite_row,
    locked_stored_artifact,
    restore_artifact_file,
    store_artifacts,
    store_artifacts_and_composites,
    store_composites,
)
from backend.artifacts.storage import artifact_storage, verified_chunks
from backend.prompting.kinds import ArtifactKind
from backend.tasks.artifact_access import visible_artifact
from backend.tasks.artifact_retention import prune_artifacts
from backend.tasks.factories import answered_task
from backend.tasks.models import Task, TranscriptPart
from backend.tasks.transcripts import StoredPiece
from tests.artifacts.test_api import assert_error, body_of, content_url
from tests.dispatch.test_dispatch_api import create, dispatch, report

pytestmark = pytest.mark.django_db

TRANSCRIPT = ArtifactKind.TRANSCRIPT.value
# Three parts, every one but the last ending with a newline, multibyte characters in two.
# Bytes 0-18 are the first part, 19-25 the second, 26-42 the third.
PARTS = ("alpha 1\nalpha 2 é\n", "beta 1\n", "tail 1 ✓\ntail 2")
WHOLE = "alpha 1\nalpha 2 é\nbeta 1\ntail 1 ✓\ntail 2".encode()
SIZE = 43
LINES = 5


def store_texts(texts: list[str] | tuple[str, ...]) -> list[Artifact]:
    """Store the texts as artifacts no task produced (so no producer grants access)."""
    with atomic_storing_artifacts():
        return store_artifacts(
            [ArtifactText(text=text, kind=TRANSCRIPT, task_id=None) for text in texts]
        )


def store_composite(parts: list[Artifact]) -> Artifact:
    with atomic_storing_artifacts():
        [composite] = store_composites([(parts, TRANSCRIPT, None)])
    return composite


def store_nested(parts: list[Artifact]) -> tuple[Artifact, Artifact]:
    """The composite of [the composite of all but the last part, the last part], stored in one
    batch as a transcript in sealed parts is; returns (the whole, its first part)."""
    prefix = composite_row(parts[:-1], kind=TRANSCRIPT, task_id=None)
    with atomic_storing_artifacts():
        stored_prefix, whole = store_composites(
            [(parts[:-1], TRANSCRIPT, None), ([prefix, parts[-1]], TRANSCRIPT, None)]
        )
    return whole, stored_prefix


def store_together(texts: tuple[str, ...]) -> tuple[list[Artifact], Artifact, Artifact]:
    """The texts and the nested composite of them in one call, as a long transcript's dispatch
    stores its newest piece with the composites naming the whole; returns (the texts' rows,
    the whole, its first part)."""
    pieces = [StoredPiece.of_text(text) for text in texts]
    prefix = composite_row(pieces[:-1], kind=TRANSCRIPT, task_id=None)
    with atomic_storing_artifacts():
        stored, (stored_prefix, whole) = store_artifacts_and_composites(
            [ArtifactText(text=text, kind=TRANSCRIPT, task_id=None) for text in texts],
            [(pieces[:-1], TRANSCRIPT, None), ([prefix, pieces[-1]], TRANSCRIPT, None)],
        )
    return stored, whole, stored_prefix


@pytest.fixture
def parts() -> list[Artifact]:
    return store_texts(PARTS)


@pytest.fixture(params=["flat", "nested", "together"])
def composite(request, parts) -> Artifact:
    """The composite of PARTS, flat or nested one level deep (or nested and stored with its
    texts, which exist already): the same bytes either way."""
    if request.param == "flat":
        return store_composite(parts)
    if request.param == "together":
        return store_together(PARTS)[1]
    return store_nested(parts)[0]


def stored_path(storage_dir: Path, artifact: Artifact) -> Path:
    return storage_dir / artifact.storage_key


# --- what a composite is -------------------------------------------------------------------


def part_ids(composite: Artifact) -> list[str]:
    return list(
        ArtifactPart.objects.filter(composite=composite)
        .order_by("position")
        .values_list("part_id", flat=True)
    )


def test_texts_and_composites_stored_together_are_stored_once_each() -> None:
    with CaptureQueriesContext(connection) as first:
        texts, whole, prefix = store_together(PARTS)
    # One insert for the texts and composites, the lock of their rows, one insert for the part
    # rows (and the transaction's begin and commit, or a savepoint and its release in a test).
    statements = [query["sql"].replace(" OR IGNORE", "") for query in first.captured_queries]
    assert [statement.split()[:3] for statement in statements[1:-1]] == [
        ["INSERT", "INTO", '"artifacts_artifact"'],
        ["SELECT", '"artifacts_artifact"."id",', '"artifacts_artifact"."sha256",'],
        ["INSERT", "INTO", '"artifacts_artifactpart"'],
    ]
    assert [text.pk for text in texts] == [StoredPiece.of_text(text).id for text in PARTS]
    assert [b"".join(artifact_storage().open(text.storage_key).read() for text in texts)] == [WHOLE]
    assert part_ids(prefix) == [text.pk for text in texts[:2]]
    assert part_ids(whole) == [prefix.pk, texts[2].pk]
    assert (whole.size_bytes, whole.size_lines, whole.composite) == (SIZE, LINES, True)
    part_rows = ArtifactPart.objects.count()

    with CaptureQueriesContext(connection) as again:
        same_texts, same_whole, same_prefix = store_together(PARTS)
    # Every row existed: the inserts skip them all and the rows are locked; no part row is
    # added.
    assert [query["sql"].split()[0] for query in again.captured_queries[1:-1]] == [
        "INSERT",
        "SELECT",
        "INSERT",
    ]
    assert [text.pk for text in same_texts] == [text.pk for text in texts]
    assert (same_whole.pk, same_prefix.pk) == (whole.pk, prefix.pk)
    assert ArtifactPart.objects.count() == part_rows


def test_a_composite_has_no_file_and_sums_its_parts(composite: Artifact) -> None:
    assert composite.composite
    assert composite.storage_key == ""
    assert (composite.size_bytes, composite.size_chars, composite.size_lines) == (SIZE, 40, LINES)


# --- served over HTTP ------------------------------------------------------------------------


def test_a_composite_is_served_whole(staff_api: APIClient, composite: Artifact) -> None:
    response = staff_api.get(content_url(composite.id))
    assert response.status_code == 200
    assert response["Content-Length"] == str(SIZE)
    assert response["ETag"] == f'"{composite.sha256}"'
    assert response["Accept-Ranges"] == "bytes"
    assert "Content-Range" not in response and "X-Baton-Lines" not in response
    assert body_of(response) == WHOLE


@pytest.mark.parametrize(
    ("header", "content_range", "expected"),
    [
        ("bytes=15-21", "bytes 15-21/43", " é\nbet".encode()),  # first part into the second
        ("bytes=18-27", "bytes 18-27/43", b"\nbeta 1\nta"),  # all three parts
        ("bytes=19-25", "bytes 19-25/43", b"beta 1\n"),  # exactly the middle part
        ("bytes=24-", "bytes 24-42/43", "1\ntail 1 ✓\ntail 2".encode()),
        ("bytes=-5", "bytes 38-42/43", b"ail 2"),
        ("bytes=0-99", "bytes 0-42/43", WHOLE),
    ],
)
def test_a_byte_range_across_part_boundaries(
    staff_api: APIClient, composite: Artifact, header, content_range, expected
) -> None:
    response = staff_api.get(content_url(composite.id), HTTP_RANGE=header)
    assert response.status_code == 206
    assert response["Content-Range"] == content_range
    assert response["Content-Length"] == str(len(expected))
    assert body_of(response) == expected


def test_a_range_with_the_composites_etag_in_if_range_is_honoured(
    staff_api: APIClient, composite: Artifact
) -> None:
    response = staff_api.get(
        content_url(composite.id), HTTP_RANGE="bytes=18-20", HTTP_IF_RANGE=f'"{composite.sha256}"'
    )
    assert response.status_code == 206
    assert body_of(response) == b"\nbe"
    not_modified = staff_api.get(
        content_url(composite.id), HTTP_IF_NONE_MATCH=f'"{composite.sha256}"'
    )
    assert not_modified.status_code == 304


def test_a_range_past_the_end_is_416(staff_api: APIClient, composite: Artifact) -> None:
    response = staff_api.get(content_url(composite.id), HTTP_RANGE="bytes=43-")
    assert_error(response, 416, "range_not_satisfiable")
    assert response["Content-Range"] == "bytes */43"


@pytest.mark.parametrize(
    ("lines", "expected", "header"),
    [
        ("2-4", "alpha 2 é\nbeta 1\ntail 1 ✓\n", "2-4/5"),  # across both boundaries
        ("2-3", "alpha 2 é\nbeta 1\n", "2-3/5"),  # ends on a part's last newline
        ("3-3", "beta 1\n", "3-3/5"),  # exactly the middle part
        ("3-", "beta 1\ntail 1 ✓\ntail 2", "3-5/5"),
        ("4-9", "tail 1 ✓\ntail 2", "4-5/5"),  # END is clamped
        ("1-1", "alpha 1\n", "1-1/5"),
    ],
)
def test_a_line_slice_across_part_boundaries(
    staff_api: APIClient, composite: Artifact, lines, expected, header
) -> None:
    response = staff_api.get(content_url(composite.id), {"lines": lines})
    assert response.status_code == 200
    assert response["X-Baton-Lines"] == header
    assert response["Content-Length"] == str(len(expected.encode()))
    assert body_of(response) == expected.encode()


def test_a_line_slice_after_the_last_line_is_416(staff_api: APIClient, composite: Artifact):
    body = assert_error(
        staff_api.get(content_url(composite.id), {"lines": "6-"}), 416, "lines_not_satisfiable"
    )
    assert body["detail"] == f"lines starts at line 6, but artifact {composite.id} has 5 lines."


@pytest.mark.parametrize("chunk_bytes", [1, 4, 19])
def test_a_composite_streams_in_chunks_across_parts(
    staff_api: APIClient, composite: Artifact, monkeypatch, chunk_bytes
) -> None:
    """Never read whole: every chunk is at most READ_CHUNK_BYTES, and a chunk takes bytes from
    the next part when one part ends inside it."""
    monkeypatch.setattr(selectors, "READ_CHUNK_BYTES", chunk_bytes)
    chunks = list(staff_api.get(content_url(composite.id)).streaming_content)
    assert b"".join(chunks) == WHOLE
    assert [len(chunk) for chunk in chunks[:-1]] == [chunk_bytes] * (len(chunks) - 1)
    assert len(chunks) == -(-SIZE // chunk_bytes)
    response = staff_api.get(content_url(composite.id), {"lines": "2-4"})
    assert body_of(response) == "alpha 2 é\nbeta 1\ntail 1 ✓\n".encode()


def test_an_unread_response_closes_every_part_file(
    staff_api: APIClient, composite: Artifact, opened_files: list
) -> None:
    opened = opened_files
    response = staff_api.get(content_url(composite.id))
    assert response.status_code == 200
    assert len(opened) == 3 and not any(stored.closed for stored in opened)
    response.close()
    assert all(stored.closed for stored in opened)


def test_finding_the_parts_costs_one_query_per_level(parts, django_assert_num_queries) -> None:
    flat = store_composite(parts)
    nested, _ = store_nested(parts)
    for composite, queries in [(flat, 1), (nested, 2)]:
        with django_assert_num_queries(queries):
            content = selectors.artifact_content(artifact=composite)
        assert b"".join(content) == WHOLE


# --- integrity -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "request_kwargs",
    [{}, {"HTTP_RANGE": "bytes=0-9"}, {"data": {"lines": "1-2"}}],
    ids=["whole", "range", "lines"],
)
def test_a_damaged_part_is_500_without_content_bytes(
    staff_api: APIClient,
    composite: Artifact,
    parts,
    artifact_storage_in_tmp,
    caplog,
    request_kwargs,
) -> None:
    damaged = parts[1]
    stored_path(artifact_storage_in_tmp, damaged).write_bytes(b"BETA 1\n")  # same size
    with caplog.at_level(logging.ERROR):
        response = staff_api.get(content_url(composite.id), **request_kwargs)
    body = assert_error(response, 500, "artifact_integrity")
    assert body["detail"] == (
        f"Artifact {composite.id} cannot be served: the stored content of its part "
        f"{damaged.id} fails its sha256 check."
    )
    assert b"alpha" not in response.content and b"BETA" not in response.content
    logged = [record.getMessage() for record in caplog.records]
    assert (
        f"artifact {composite.id}: the stored content of its part {damaged.id} fails its "
        "sha256 check" in logged
    )
    composite.refresh_from_db()
    assert composite.last_read_at is None


def test_a_missing_part_file_is_500(
    staff_api: APIClient, composite: Artifact, parts, artifact_storage_in_tmp
) -> None:
    stored_path(artifact_storage_in_tmp, parts[2]).unlink()
    body = assert_error(staff_api.get(content_url(composite.id)), 500, "artifact_integrity")
    assert body["detail"] == (
        f"Artifact {composite.id} cannot be served: the stored content of its part "
        f"{parts[2].id} is missing."
    )


def test_a_part_the_composite_was_not_made_of_is_500(staff_api: APIClient, parts, caplog) -> None:
    composite = store_composite(parts)
    [intruder] = store_texts(["beta 2\n"])  # intact, and the same size as the part it replaces
    ArtifactPart.objects.filter(composite=composite, position=1).update(part=intruder)
    with caplog.at_level(logging.ERROR):
        response = staff_api.get(content_url(composite.id))
    body = assert_error(response, 500, "artifact_integrity")
    assert body["detail"] == (
        f"Artifact {composite.id} cannot be served: its parts do not match its sha256."
    )
    assert f"artifact {composite.id}: its parts do not match its sha256" in [
        record.getMessage() for record in caplog.records
    ]


def test_a_nested_part_the_composite_was_not_made_of_is_500(staff_api: APIClient, parts):
    whole, prefix = store_nested(parts)
    [intruder] = store_texts(["beta 2\n"])
    ArtifactPart.objects.filter(composite=prefix, position=1).update(part=intruder)
    body = assert_error(staff_api.get(content_url(whole.id)), 500, "artifact_integrity")
    assert body["detail"] == (
        f"Artifact {whole.id} cannot be served: the parts of its part {prefix.id} do not "
        "match that part's sha256."
    )


def test_a_composite_whose_recorded_size_is_wrong_is_500(staff_api: APIClient, parts) -> None:
    composite = store_composite(parts)
    Artifact.objects.filter(pk=composite.pk).update(size_bytes=SIZE + 1)
    body = assert_error(
        staff_api.get(content_url(composite.id), HTTP_RANGE="bytes=40-"), 500, "artifact_integrity"
    )
    assert body["detail"] == (
        f"Artifact {composite.id} cannot be served: its parts hold 43 bytes, not its recorded 44."
    )


# --- paths that open a stored file by its key refuse a composite -----------------------------


def test_paths_that_read_one_stored_file_refuse_a_composite(composite: Artifact) -> None:
    # An upload naming a composite's sha256 names no stored value.
    with transaction.atomic():
        assert locked_stored_artifact(sha256=composite.sha256) is None
        assert not restore_artifact_file(artifact=composite, text=WHOLE.decode())
    with pytest.raises(ValueError, match=f"artifact {composite.id} has no stored object"):
        verified_chunks(storage_key="", sha256=composite.sha256, artifact_id=composite.id)


# --- who may read the parts ------------------------------------------------------------------


def transcript_part(task: Task, pieces: list[Artifact]) -> TranscriptPart:
    """A sealed transcript part of `task` (messages 1-2) whose three artifacts are `pieces`:
    its piece of the transcript, its rows of the turn index and the list of its turn files."""
    sealed_transcript, sealed_index, file_list = pieces
    return TranscriptPart.objects.create(
        task=task,
        span=128,
        number=0,
        first_message_id=1,
        last_message_id=2,
        message_runs=[[1, 2]],
        turns=2,
        users=1,
        assistants=1,
        is_group_chat=False,
        multi_bot=False,
        builder_version="test",
        transcript=sealed_transcript,
        turn_index=sealed_index,
        turn_files=file_list,
        pieces=[
            [piece.id, piece.sha256, piece.size_bytes, piece.size_chars, piece.size_lines]
            for piece in pieces
        ],
    )


@pytest.fixture
def history(api: APIClient, worker_api: APIClient, pipeline_bots) -> dict:
    """A task whose turn `worker` holds, with a transcript and a turn index in parts as a
    dispatch stores them: each the composite of [the composite of the sealed parts' pieces,
    the tail], and the sealed part's row naming its piece, its index rows and its file list."""
    task = create(api)
    [turn] = dispatch(worker_api)
    sealed_transcript, sealed_index, file_list, tail, index_tail = store_texts(
        ["User: hi\n", "1\tuser\n", '{"files":[]}\n', "Assistant: hello", "2\tassistant"]
    )
    transcript, transcript_prefix = store_nested([sealed_transcript, tail])
    index, index_prefix = store_nested([sealed_index, index_tail])
    Task.objects.filter(pk=task["id"]).update(transcript=transcript, turn_index=index)
    transcript_part(Task.objects.get(pk=task["id"]), [sealed_transcript, sealed_index, file_list])
    return {
        "turn": turn,
        "readable": {
            transcript.id: b"User: hi\nAssistant: hello",
            index.id: b"1\tuser\n2\tassistant",
            # Parts of the current transcript and index.
            transcript_prefix.id: b"User: hi\n",
            tail.id: b"Assistant: hello",
            index_prefix.id: b"1\tuser\n",
            index_tail.id: b"2\tassistant",
            # The sealed part's artifacts: only its row makes them readable (its piece is a
            # part of the prefix, which no task names; its file list is part of nothing).
            sealed_transcript.id: b"User: hi\n",
            sealed_index.id: b"1\tuser\n",
            file_list.id: b'{"files":[]}\n',
        },
    }


def test_the_worker_holding_the_turn_reads_the_parts_and_the_sealed_parts(
    worker_api: APIClient, api: APIClient, history
) -> None:
    for client in (worker_api, api):  # the worker, and the task's owner
        for artifact_id, expected in history["readable"].items():
            response = client.get(content_url(artifact_id))
            assert response.status_code == 200, artifact_id
            assert body_of(response) == expected


def test_others_cannot_read_the_parts(
    other_api: APIClient, other_worker_api: APIClient, history
) -> None:
    for client in (other_api, other_worker_api):
        for artifact_id in history["readable"]:
            assert_error(client.get(content_url(artifact_id)), 404, "not_found")
            assert_error(client.get(f"/api/artifacts/{artifact_id}/"), 404, "not_found")


def test_the_worker_reads_the_parts_no_longer_once_its_claim_ends(
    worker_api: APIClient, history
) -> None:
    assert report(worker_api, history["turn"], result={"value": "Done."}).status_code == 200
    for artifact_id in history["readable"]:
        assert_error(worker_api.get(content_url(artifact_id)), 404, "not_found")


def test_a_part_of_a_composite_no_task_references_is_not_readable(
    api: APIClient, worker_api: APIClient, history
) -> None:
    dead_parts = store_texts(["dead 1\n", "dead 2"])
    store_composite(dead_parts)
    for client in (api, worker_api):
        for part in dead_parts:
            assert_error(client.get(content_url(part.id)), 404, "not_found")


def test_reading_a_part_is_still_one_query(worker, history, django_assert_num_queries) -> None:
    for artifact_id in history["readable"]:
        with django_assert_num_queries(1):
            assert visible_artifact(user=worker, artifact_id=artifact_id).id == artifact_id


# --- pruning ---------------------------------------------------------------------------------

NINETY_DAYS_AGO = timedelta(days=90)
THIRTY_DAYS = timedelta(days=30)


@pytest.fixture
def removed_files(monkeypatch) -> list[tuple[str, str]]:
    """Every (sha256, storage key) whose file removal pruning attempts; the removal still runs."""
    calls: list[tuple[str, str]] = []
    remove = retention.remove_unowned_file

    def recording(*, sha256: str, storage_key: str) -> bool:
        calls.append((sha256, storage_key))
        return remove(sha256=sha256, storage_key=storage_key)

    monkeypatch.setattr(retention, "remove_unowned_file", recording)
    return calls


def age_every_artifact() -> None:
    Artifact.objects.update(created_at=timezone.now() - NINETY_DAYS_AGO, last_read_at=None)


def pruned(artifacts: list[Artifact]) -> list[PrunedArtifact]:
    """What pruning reports for these artifacts, in its order (all are equally old)."""
    return [
        PrunedArtifact(id=artifact.id, kind=artifact.kind, size_bytes=artifact.size_bytes)
        for artifact in sorted(artifacts, key=lambda artifact: artifact.id)
    ]


def exists(artifact: Artifact) -> bool:
    return Artifact.objects.filter(pk=artifact.pk).exists()


def test_live_parts_stay_and_an_unreferenced_composite_goes_before_its_parts(
    user, removed_files
) -> None:
    task = answered_task(owner=user, title="Live", message="Hi.", answer="Hello.")
    live_parts = store_texts(["live 1\n", "live tail"])
    live = store_composite(live_parts)
    Task.objects.filter(pk=task.pk).update(transcript=live)
    sealed = store_texts(["sealed transcript\n", "sealed index\n", '{"files":[]}\n'])
    transcript_part(task, sealed)
    dead_parts = store_texts(["dead 1\n", "dead tail"])
    dead = store_composite(dead_parts)
    age_every_artifact()

    assert prune_artifacts(older_than=THIRTY_DAYS, dry_run=True) == pruned([dead])
    assert prune_artifacts(older_than=THIRTY_DAYS, dry_run=False) == pruned([dead])
    assert removed_files == []  # a composite has no file to remove
    assert not exists(dead) and not ArtifactPart.objects.filter(composite_id=dead.pk).exists()
    assert all(exists(part) and artifact_storage().exists(part.storage_key) for part in dead_parts)

    # Its parts were still its parts when the first run listed them; the next run takes them.
    assert prune_artifacts(older_than=THIRTY_DAYS, dry_run=False) == pruned(dead_parts)
    ordered = sorted(dead_parts, key=lambda artifact: artifact.id)
    assert removed_files == [(part.sha256, part.storage_key) for part in ordered]
    assert not any(artifact_storage().exists(part.storage_key) for part in dead_parts)

    assert prune_artifacts(older_than=THIRTY_DAYS, dry_run=False) == []
    for kept in (live, *live_parts, *sealed):
        assert exists(kept)
    for kept in (*live_parts, *sealed):
        assert artifact_storage().exists(kept.storage_key)


def test_a_deleted_tasks_history_is_pruned_level_by_level(user, removed_files) -> None:
    task = answered_task(owner=user, title="Gone", message="Hi.", answer="Hello.")
    sealed_transcript, sealed_index, file_list, tail = store_texts(
        ["User: hi\n", "1\tuser\n", '{"files":[]}\n', "Assistant: hello"]
    )
    transcript, prefix = store_nested([sealed_transcript, tail])
    Task.objects.filter(pk=task.pk).update(transcript=transcript, turn_index=sealed_index)
    transcript_part(task, [sealed_transcript, sealed_index, file_list])
    age_every_artifact()
    assert prune_artifacts(older_than=timedelta(0), dry_run=False) == []

    task.delete()  # its sealed parts go with it
    assert prune_artifacts(older_than=THIRTY_DAYS, dry_run=False) == pruned(
        [transcript, sealed_index, file_list]
    )
    assert prune_artifacts(older_than=THIRTY_DAYS, dry_run=False) == pruned([prefix, tail])
    assert prune_artifacts(older_than=THIRTY_DAYS, dry_run=False) == pruned([sealed_transcript])
    assert prune_artifacts(older_than=THIRTY_DAYS, dry_run=False) == []
    assert {key for _, key in removed_files} == {
        artifact.storage_key for artifact in (sealed_index, file_list, tail, sealed_transcript)
    }
    assert "" not in {key for _, key in removed_files}


# --- admin -----------------------------------------------------------------------------------


def test_the_admin_shows_a_composites_parts(client, parts) -> None:
    composite = store_composite(parts)
    root = get_user_model().objects.create_superuser(
        username="root", password="root-password", email="root@example.com"
    )
    client.force_login(root)
    page = client.get(f"/admin/artifacts/artifact/{composite.id}/change/").content.decode()
    for position, (part, chars, lines, size) in enumerate(
        zip(parts, (18, 7, 15), (2, 1, 2), (19, 7, 17), strict=True)
    ):
        link = f'<a href="/admin/artifacts/artifact/{part.id}/change/">{part.id}</a>'
        assert f"{position}: {link} ({chars} chars, {lines} lines, {size} bytes)" in page
    listing = client.get("/admin/artifacts/artifact/", {"composite__exact": "1"})
    assert listing.status_code == 200
    assert composite.id in listing.content.decode()
    assert parts[0].id not in listing.content.decode()


# --- the served slice is the slice of the concatenation --------------------------------------

# Every part but the last ends with a newline, as a composite's parts do.
part_texts = st.tuples(
    st.lists(st.text(max_size=12).map(lambda text: text + "\n"), min_size=1, max_size=3),
    st.text(max_size=12),
).map(lambda parts: [*parts[0], parts[1]])


def split_lines(text: str) -> list[str]:
    """The lines as ingestion counts them: split on "\\n", each keeping its newline."""
    pieces = text.split("\n")
    return [piece + "\n" for piece in pieces[:-1]] + ([pieces[-1]] if pieces[-1] else [])


@settings(max_examples=60, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(texts=part_texts, data=st.data(), chunk_bytes=st.sampled_from([1, 3, 64]))
def test_any_served_slice_is_that_slice_of_the_concatenation(
    staff_api: APIClient, monkeypatch, texts, data, chunk_bytes
) -> None:
    whole_text = "".join(texts)
    whole = whole_text.encode()
    composite = store_composite(store_texts(texts))
    with monkeypatch.context() as patch:
        patch.setattr(selectors, "READ_CHUNK_BYTES", chunk_bytes)

        first = data.draw(st.integers(0, len(whole) - 1), label="first byte")
        last = data.draw(st.integers(first, len(whole) + 3), label="last byte")
        response = staff_api.get(content_url(composite.id), HTTP_RANGE=f"bytes={first}-{last}")
        assert response.status_code == 206
        assert body_of(response) == whole[first : last + 1]

        lines = split_lines(whole_text)
        start = data.draw(st.integers(1, len(lines)), label="first line")
        end = data.draw(st.none() | st.integers(start, len(lines) + 2), label="last line")
        spec = f"{start}-" if end is None else f"{start}-{end}"
        response = staff_api.get(content_url(composite.id), {"lines": spec})
        assert response.status_code == 200
        shown = len(lines) if end is None else min(end, len(lines))
        assert response["X-Baton-Lines"] == f"{start}-{shown}/{len(lines)}"
        assert body_of(response) == "".join(lines[start - 1 : shown]).encode()
