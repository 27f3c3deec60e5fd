"""Fixtures for artifact tests: spilled turns whose text lives in an artifact."""

from __future__ import annotations

import pytest

from backend.artifacts import selectors
from backend.artifacts.models import Artifact
from backend.prompting import Role
from backend.tasks.factories import answered_task
from backend.tasks.models import Task
from tests.artifacts.s3 import s3_bucket, s3_endpoint  # noqa: F401 - fixtures for these tests

# Over the 16,000-char spill threshold, multibyte UTF-8 on every line, and a last line without
# a trailing newline.
LINE_COUNT = 1_000
SPILLED_TEXT = (
    "".join(f"line {number:04d} héllo € ✓\n" for number in range(1, LINE_COUNT + 1))
    + "last line 😀 without newline"
)
SPILLED_LINES = SPILLED_TEXT.split("\n")  # the last entry is the unterminated last line


def spill(*, owner, text: str = SPILLED_TEXT, title: str = "Spill") -> Artifact:
    """Create a task whose assistant answers with `text`, and return the artifact it spilled to."""
    task = answered_task(owner=owner, title=title, message="Run the tests.", answer=text)
    turn = task.subtasks.select_related("artifact").get(role=Role.ASSISTANT)
    assert turn.artifact is not None, "the text should have spilled to an artifact"
    return turn.artifact


def task_of(artifact: Artifact) -> Task:
    return Task.objects.get(pk=artifact.task_id)


@pytest.fixture
def opened_files(monkeypatch) -> list:
    """Every stored file the artifact selectors open from now on, in order (still open or not)."""
    opened = []
    storage = selectors.artifact_storage()

    class RecordingStorage:
        def open(self, name: str, mode: str = "rb"):
            stored = storage.open(name, mode)
            opened.append(stored)
            return stored

    monkeypatch.setattr(selectors, "artifact_storage", RecordingStorage)
    return opened


@pytest.fixture
def artifact(user) -> Artifact:
    return spill(owner=user)
