"""Artifacts on an S3-compatible object store, for real: a result spilled over HTTP, its content
whole, by Range and by `?lines=`, the sha256 check, a value upload, pruning with the orphan
sweep and the worker's download, all against moto's S3 server on 127.0.0.1 (`tests.artifacts.s3`),
with nothing written to the local disk."""

from __future__ import annotations

import hashlib
import socket
from datetime import timedelta
from io import StringIO
from pathlib import Path

import pytest
from django.core.management import call_command
from django.utils import timezone
from rest_framework.authtoken.models import Token

from backend.artifacts.models import Artifact
from backend.artifacts.storage import (
    READ_CHUNK_BYTES,
    ArtifactIntegrityError,
    artifact_storage,
    content_address,
    read_text_ends,
    storage_key_for,
)
from backend.tasks.models import Subtask
from executors.client import BackendClient, BackendError
from executors.workspace import materialize_artifacts
from tests.api.test_turn_texts import SINGLE, answered, create, dispatch, report, whole
from tests.artifacts.conftest import spill
from tests.artifacts.s3 import Bucket
from tests.artifacts.test_api import assert_error, content_url
from tests.artifacts.test_retention import age, orphan
from tests.dispatch.test_value_uploads import upload_sha
from tests.executors.test_result_upload import RecordingTransport

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("pipeline_bots")]

# Over the 16,000-char spill threshold; multibyte, so chars and bytes differ; no final newline.
LOG = "".join(f"step {n:05d} compiled ✓\n" for n in range(3_000)) + "done ✓"
LOG_BYTES = LOG.encode()
LOG_LINES = LOG.splitlines(keepends=True)


def spilled(api, worker_api, text: str = LOG) -> tuple[Subtask, Artifact]:
    """A task whose one assistant turn reported `text` over HTTP: the turn and its artifact."""
    turn = answered(api, worker_api, result={"value": text})
    subtask = Subtask.objects.select_related("artifact").get(pk=turn["subtask_id"])
    assert subtask.artifact is not None
    return subtask, subtask.artifact


def text_url(subtask: Subtask) -> str:
    return f"/api/tasks/{subtask.task_id}/subtasks/{subtask.pk}/text/"


def local_files(directory: Path) -> list[Path]:
    return [path for path in directory.rglob("*") if path.is_file()]


def test_a_long_result_reported_over_http_spills_to_the_bucket(
    api, worker_api, s3_bucket: Bucket, artifact_storage_in_tmp: Path
) -> None:
    _, artifact = spilled(api, worker_api)

    assert artifact.storage_key == storage_key_for(hashlib.sha256(LOG_BYTES).hexdigest())
    assert s3_bucket.object_keys() == [artifact.storage_key]
    assert s3_bucket.get(artifact.storage_key) == LOG_BYTES
    assert local_files(artifact_storage_in_tmp) == []


@pytest.mark.parametrize("endpoint", ["artifact", "turn_text"])
def test_content_is_served_from_the_bucket_whole_by_range_and_by_lines(
    api, worker_api, s3_bucket: Bucket, endpoint: str
) -> None:
    subtask, artifact = spilled(api, worker_api)
    url = content_url(artifact.id) if endpoint == "artifact" else text_url(subtask)
    etag = f'"{artifact.sha256}"'

    response = api.get(url)
    assert response.status_code == 200
    assert response["ETag"] == etag
    assert whole(response) == LOG_BYTES

    response = api.get(url, HTTP_RANGE="bytes=100-199")
    assert response.status_code == 206
    assert response["Content-Range"] == f"bytes 100-199/{len(LOG_BYTES)}"
    assert whole(response) == LOG_BYTES[100:200]

    response = api.get(url, HTTP_RANGE="bytes=-20")
    assert response.status_code == 206
    assert whole(response) == LOG_BYTES[-20:]

    response = api.get(url, {"lines": "2999-"})
    assert response.status_code == 200
    assert response["X-Baton-Lines"] == f"2999-3001/{len(LOG_LINES)}"
    assert whole(response) == "".join(LOG_LINES[2998:]).encode()

    assert api.get(url, HTTP_IF_NONE_MATCH=etag).status_code == 304


@pytest.mark.parametrize(
    "request_kwargs",
    [{}, {"HTTP_RANGE": "bytes=0-9"}, {"data": {"lines": "1-2"}}],
    ids=["whole", "range", "lines"],
)
def test_a_damaged_or_missing_object_is_an_integrity_error_not_wrong_bytes(
    api, worker_api, s3_bucket: Bucket, request_kwargs
) -> None:
    subtask, artifact = spilled(api, worker_api)
    damaged = b"XXXX" + LOG_BYTES[4:]  # same size, different bytes
    s3_bucket.put(artifact.storage_key, damaged)

    for url in (content_url(artifact.id), text_url(subtask)):
        response = api.get(url, **request_kwargs)
        body = assert_error(response, 500, "artifact_integrity")
        assert "sha256" in body["detail"]
        assert b"XXXX" not in response.content

    s3_bucket.client.delete_object(Bucket=s3_bucket.name, Key=artifact.storage_key)
    body = assert_error(
        api.get(content_url(artifact.id), **request_kwargs), 500, "artifact_integrity"
    )
    assert "missing" in body["detail"]


def test_repeating_a_report_rewrites_a_damaged_object(api, worker_api, s3_bucket: Bucket) -> None:
    create(api)
    turn = dispatch(worker_api)
    assert report(worker_api, turn, result={"value": LOG}).status_code == 200
    [key] = s3_bucket.object_keys()
    s3_bucket.put(key, LOG_BYTES[:100])

    response = report(worker_api, turn, result={"value": LOG})

    assert response.status_code == 200, response.json()
    assert s3_bucket.get(key) == LOG_BYTES


def test_an_uploaded_value_is_stored_in_the_bucket_and_recorded(
    api, worker_api, s3_bucket: Bucket, artifact_storage_in_tmp: Path
) -> None:
    # Past the 4 MiB a read or an upload keeps in memory, and past boto3's 8 MiB multipart
    # threshold: the upload is spooled to a temporary file and sent in parts, the preview's two
    # ends are read back from the object.
    value = "".join(f"line {n:07d} of the build log ✓\n" for n in range(300_000))
    assert len(value.encode()) > 9 * 1024 * 1024
    create(api)
    turn = dispatch(worker_api)

    sha256 = upload_sha(worker_api, turn, value)
    response = report(worker_api, turn, result={"commands": ["make"]}, value_upload=sha256)

    assert response.status_code == 200, response.json()
    assert s3_bucket.object_keys() == [storage_key_for(sha256)]
    subtask = Subtask.objects.select_related("artifact").get(pk=turn["subtask_id"])
    assert subtask.result_value_in_artifact
    assert subtask.artifact is not None and subtask.artifact.sha256 == sha256
    assert subtask.preview_tail.endswith("line 0299999 of the build log ✓\n")
    assert whole(api.get(text_url(subtask), {"lines": "300000-"})) == (
        "line 0299999 of the build log ✓\n".encode()
    )
    assert local_files(artifact_storage_in_tmp) == []


def put_object(s3_bucket: Bucket, key: str, data: bytes, *, age: timedelta) -> str:
    s3_bucket.put(key, data)
    s3_bucket.set_modified(key, timezone.now() - age)
    return key


def test_prune_removes_old_artifacts_and_orphan_objects_from_the_bucket(
    user, s3_bucket: Bucket
) -> None:
    old = spill(owner=user, text="orphan\n" + "o" * 20_000, title="Old, deleted")
    age(old, days=90)
    orphan(old)
    kept = spill(owner=user, text="kept\n" + "k" * 20_000, title="Still referenced")
    age(kept, days=90)
    s3_bucket.set_modified(kept.storage_key, timezone.now() - timedelta(days=90))
    rolled_back = "rolled back\n" * 2_000
    stale = put_object(
        s3_bucket,
        content_address(rolled_back).storage_key,
        rolled_back.encode(),
        age=timedelta(days=2),
    )
    being_written = "being written\n" * 2_000
    young = put_object(
        s3_bucket,
        content_address(being_written).storage_key,
        being_written.encode(),
        age=timedelta(minutes=5),
    )
    foreign = put_object(s3_bucket, "README.txt", b"not ours", age=timedelta(days=30))
    assert artifact_storage().exists(old.storage_key)

    out = StringIO()
    call_command("prune_artifacts", "--older-than", "30", stdout=out)

    assert out.getvalue().splitlines() == [
        f"removed {old.id} {old.kind} {old.size_bytes} bytes",
        f"Removed 1 artifacts, {old.size_bytes} bytes",
        f"removed orphan file {stale} {len(rolled_back.encode())} bytes",
        f"Removed 1 orphan files, {len(rolled_back.encode())} bytes",
    ]
    assert s3_bucket.object_keys() == sorted([kept.storage_key, young, foreign])
    assert not Artifact.objects.filter(pk=old.pk).exists()


def test_the_worker_downloads_a_manifest_artifact_from_the_bucket(
    api, worker, worker_api, s3_bucket: Bucket, tmp_path: Path
) -> None:
    task = create(api, SINGLE)
    turn = dispatch(worker_api)
    assert report(worker_api, turn, result={"value": LOG}).status_code == 200
    artifact = Artifact.objects.get()
    api.post(f"/api/tasks/{task['id']}/messages/", {"message": "and?"}, format="json")
    client = BackendClient(
        base_url="http://testserver",
        token=Token.objects.get_or_create(user=worker)[0].key,
        worker_id="w1",
        retry_budget_seconds=1.0,
        transport=RecordingTransport(),
    )
    [claimed] = client.dispatch(kinds=["codex"], limit=1).turns
    manifest = [entry for entry in claimed.artifacts if entry.id == artifact.id]
    assert manifest, "the follow-up's prompt cut the previous result and points at its artifact"
    workspace = tmp_path / "workspace"

    assert materialize_artifacts(client=client, workspace=workspace, manifest=manifest) == 1
    assert (workspace / manifest[0].path).read_bytes() == LOG_BYTES

    # A damaged object never reaches the workspace: Baton answers 500 before the first byte.
    (workspace / manifest[0].path).unlink()
    s3_bucket.put(artifact.storage_key, b"XXXX" + LOG_BYTES[4:])
    with pytest.raises(BackendError, match="HTTP 500"):
        materialize_artifacts(client=client, workspace=workspace, manifest=manifest)
    assert list(workspace.rglob("*.txt")) == []


BIG = "".join(f"row {n:07d} ünïcödé ✓\n" for n in range(300_000))  # about 8 MB


def test_the_two_ends_of_an_object_are_read_without_the_rest(s3_bucket: Bucket) -> None:
    key = content_address(BIG).storage_key
    s3_bucket.put(key, BIG.encode())
    size = len(BIG.encode())
    assert size > 6 * READ_CHUNK_BYTES

    with artifact_storage().open(key, "rb") as stored:
        head, tail = read_text_ends(stored, size_bytes=size, chars=50)
        received = stored.file.raw.received

    assert (head, tail) == (BIG[:50], BIG[-50:])
    assert received <= 2 * READ_CHUNK_BYTES


def test_an_object_replaced_while_it_is_read_is_an_integrity_error(s3_bucket: Bucket) -> None:
    key = content_address(BIG).storage_key
    s3_bucket.put(key, BIG.encode())

    with artifact_storage().open(key, "rb") as stored:
        assert stored.read(10) == BIG.encode()[:10]
        s3_bucket.put(key, BIG.encode().replace(b"row", b"XXX"))
        stored.seek(5 * READ_CHUNK_BYTES)
        with pytest.raises(ArtifactIntegrityError, match="replaced or removed"):
            stored.read(10)


def closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.mark.parametrize("fault", ["bucket_missing", "store_unreachable"])
def test_a_store_that_takes_no_write_records_nothing_and_a_retry_succeeds(
    api, worker_api, s3_bucket: Bucket, settings, monkeypatch: pytest.MonkeyPatch, fault: str
) -> None:
    working = settings.STORAGES
    if fault == "bucket_missing":
        s3_bucket.client.delete_bucket(Bucket=s3_bucket.name)
    else:
        monkeypatch.setenv("AWS_MAX_ATTEMPTS", "1")  # no retries with backoff against a closed port
        options = {**working["artifacts"]["OPTIONS"]}
        options["endpoint_url"] = f"http://127.0.0.1:{closed_port()}"
        settings.STORAGES = {**working, "artifacts": {**working["artifacts"], "OPTIONS": options}}
    create(api)
    turn = dispatch(worker_api)

    response = report(worker_api, turn, result={"value": LOG})

    assert_error(response, 503, "storage_unavailable")
    assert not Artifact.objects.exists()
    assert Subtask.objects.get(pk=turn["subtask_id"]).status == "RUNNING"
    if fault == "bucket_missing":
        s3_bucket.client.create_bucket(Bucket=s3_bucket.name)
    settings.STORAGES = working
    assert report(worker_api, turn, result={"value": LOG}).status_code == 200
    assert s3_bucket.get(Artifact.objects.get().storage_key) == LOG_BYTES
