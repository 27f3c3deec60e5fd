"""A storage write that fails halfway, or a transaction that rolls back after a write, leaves no
row and no file behind, and the same request succeeds when retried."""

from __future__ import annotations

import errno
import logging
import os
from pathlib import Path

import pytest
from django.core.files.base import ContentFile, File
from django.core.files.storage import FileSystemStorage

from backend.artifacts.models import Artifact
from backend.artifacts.services import atomic_storing_artifacts, store_artifact
from backend.artifacts.storage import artifact_storage, content_address
from backend.tasks.models import Subtask, Task

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("pipeline_bots")]

SINGLE = {"title": "Fix", "task_type": "code", "message": "CI is red.", "executor": "codex"}
# Over the 16,000-char spill threshold.
LONG_ANSWER = "".join(f"test {number:05d} passed ✓\n" for number in range(1, 2_001))


class DiskFullStorage(FileSystemStorage):
    """Writes the first half of every file at its name, then fails as a full disk does."""

    def _save(self, name: str, content: File) -> str:
        data = content.read()
        saved = super()._save(name, ContentFile(data[: len(data) // 2]))
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), self.path(saved))


class Boom(Exception):
    pass


@pytest.fixture
def disk_full(settings, artifact_storage_in_tmp):
    """Switch the artifact storage to DiskFullStorage; calling the fixture's value switches back."""
    working = settings.STORAGES

    def restore() -> None:
        settings.STORAGES = working

    settings.STORAGES = {
        **working,
        "artifacts": {
            "BACKEND": f"{__name__}.DiskFullStorage",
            "OPTIONS": {"location": str(artifact_storage_in_tmp)},
        },
    }
    return restore


def stored_files(root: Path) -> list[Path]:
    return sorted(path for path in root.rglob("*") if path.is_file())


def result_path(turn: dict) -> str:
    return f"/api/executor/subtasks/{turn['subtask_id']}/result/"


@pytest.fixture
def claimed_turn(api, worker_api) -> dict:
    assert api.post("/api/tasks/", SINGLE, format="json").status_code == 201
    response = worker_api.post(
        "/api/executor/dispatch/", {"kinds": ["codex"], "worker_id": "w1"}, format="json"
    )
    [turn] = response.json()["turns"]
    return turn


def test_a_result_whose_artifact_write_fails_halfway_records_nothing_and_can_be_retried(
    worker_api, claimed_turn, disk_full, artifact_storage_in_tmp, caplog
):
    report = {
        "worker_id": "w1",
        "attempt": claimed_turn["attempt"],
        "status": "COMPLETED",
        "result": {"value": LONG_ANSWER},
    }
    with caplog.at_level(logging.INFO):
        failed = worker_api.post(result_path(claimed_turn), report, format="json")

    assert failed.status_code == 503
    assert failed["Content-Type"] == "application/json"
    assert failed.json() == {
        "detail": (
            f"Artifact storage could not take a {len(LONG_ANSWER.encode())}-byte write "
            "(ENOSPC); nothing was recorded. Retry later."
        ),
        "code": "storage_unavailable",
    }
    turn = Subtask.objects.get(pk=claimed_turn["subtask_id"])
    assert (turn.status, turn.result, turn.artifact_id) == ("RUNNING", None, None)
    assert not Artifact.objects.exists()
    assert stored_files(artifact_storage_in_tmp) == []  # the half-written file is gone
    assert "artifact_write_failed" in caplog.text
    assert "test 00001 passed" not in caplog.text

    disk_full()  # the disk has room again: the worker's retry of the same report is recorded
    retried = worker_api.post(result_path(claimed_turn), report, format="json")

    assert retried.status_code == 200, retried.json()
    turn.refresh_from_db()
    assert turn.status == "COMPLETED"
    artifact = Artifact.objects.get()
    assert turn.artifact_id == artifact.pk
    [file] = stored_files(artifact_storage_in_tmp)
    assert file.read_text(encoding="utf-8") == LONG_ANSWER
    assert artifact_storage().path(artifact.storage_key) == str(file)


def test_a_message_whose_artifact_write_fails_creates_no_task(
    api, disk_full, artifact_storage_in_tmp
):
    response = api.post("/api/tasks/", {**SINGLE, "message": LONG_ANSWER}, format="json")

    assert response.status_code == 503
    assert response.json()["code"] == "storage_unavailable"
    assert not Task.objects.exists()
    assert not Artifact.objects.exists()
    assert stored_files(artifact_storage_in_tmp) == []


def test_a_rolled_back_transaction_removes_the_file_it_wrote() -> None:
    key = content_address(LONG_ANSWER).storage_key
    with pytest.raises(Boom), atomic_storing_artifacts():
        store_artifact(text=LONG_ANSWER, kind="text", task_id=None)
        assert artifact_storage().exists(key)
        raise Boom

    assert not Artifact.objects.exists()
    assert not artifact_storage().exists(key)


def test_a_write_handed_to_an_outer_transaction_goes_when_the_outer_one_rolls_back() -> None:
    key = content_address(LONG_ANSWER).storage_key
    with pytest.raises(Boom), atomic_storing_artifacts():
        with atomic_storing_artifacts():
            store_artifact(text=LONG_ANSWER, kind="text", task_id=None)
        raise Boom

    assert not Artifact.objects.exists()
    assert not artifact_storage().exists(key)


def test_a_rolled_back_write_keeps_a_file_that_a_committed_row_owns() -> None:
    """The rolled-back transaction rewrote a missing file that another row names."""
    owner = store_artifact(text=LONG_ANSWER, kind="text", task_id=None)
    artifact_storage().delete(owner.storage_key)

    with pytest.raises(Boom), atomic_storing_artifacts():
        assert store_artifact(text=LONG_ANSWER, kind="text", task_id=None) == owner
        raise Boom

    assert Artifact.objects.get() == owner
    with artifact_storage().open(owner.storage_key, "rb") as stored:
        assert stored.read() == LONG_ANSWER.encode()


def test_a_value_upload_whose_write_fails_leaves_nothing_and_can_be_retried(
    worker_api, claimed_turn, disk_full, artifact_storage_in_tmp
):
    url = (
        f"/api/executor/subtasks/{claimed_turn['subtask_id']}/result/value/"
        f"?worker_id=w1&attempt={claimed_turn['attempt']}"
    )
    body = LONG_ANSWER.encode()
    failed = worker_api.put(url, body, content_type="text/plain; charset=utf-8")

    assert (failed.status_code, failed.json()["code"]) == (503, "storage_unavailable")
    assert not Artifact.objects.exists()
    assert stored_files(artifact_storage_in_tmp) == []  # the half-written file is gone
    assert Subtask.objects.get(pk=claimed_turn["subtask_id"]).status == "RUNNING"

    disk_full()  # room again: the worker's retry of the same upload, then its report
    uploaded = worker_api.put(url, body, content_type="text/plain; charset=utf-8")
    assert uploaded.status_code == 200, uploaded.json()
    report = {
        "worker_id": "w1",
        "attempt": claimed_turn["attempt"],
        "status": "COMPLETED",
        "value_upload": uploaded.json()["value_upload"],
    }
    assert worker_api.post(result_path(claimed_turn), report, format="json").status_code == 200
    [file] = stored_files(artifact_storage_in_tmp)
    assert file.read_bytes() == body
