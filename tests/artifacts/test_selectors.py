"""Who may see an artifact (tasks' access rules), and the dispatch manifest (one query each)."""

from __future__ import annotations

import pytest

from backend.artifacts.models import Artifact
from backend.artifacts.selectors import manifest_artifacts
from backend.errors import NotFound
from backend.tasks.artifact_access import visible_artifact
from tests.artifacts.conftest import SPILLED_TEXT, spill, task_of

pytestmark = pytest.mark.django_db


@pytest.fixture
def three_artifacts(user) -> list[Artifact]:
    return [spill(owner=user, text=f"{index}\n" + "x" * 20_000) for index in range(3)]


def test_manifest_keeps_the_order_given_in_one_query(
    three_artifacts, django_assert_num_queries
) -> None:
    first, second, third = three_artifacts
    ids = [third.id, first.id, second.id, first.id]  # a repeated id is listed once
    with django_assert_num_queries(1):
        manifest = manifest_artifacts(artifact_ids=ids)
        # Everything a manifest entry shows is loaded by that one query.
        entries = [
            (artifact.sha256, artifact.kind, artifact.size_bytes, artifact.size_chars)
            + (artifact.size_lines, artifact.workspace_path)
            for artifact in manifest
        ]
    assert manifest == [third, first, second]
    assert entries[0] == (
        third.sha256,
        third.kind,
        third.size_bytes,
        third.size_chars,
        third.size_lines,
        f".baton/artifacts/{third.id}.txt",
    )


def test_empty_manifest_costs_no_query(django_assert_num_queries) -> None:
    with django_assert_num_queries(0):
        assert manifest_artifacts(artifact_ids=[]) == []


def test_manifest_with_an_unknown_id_names_it(three_artifacts) -> None:
    with pytest.raises(NotFound, match="0123456789abcdef"):
        manifest_artifacts(artifact_ids=[three_artifacts[0].id, "0123456789abcdef"])


def test_visible_artifact_is_one_query(user, django_assert_num_queries) -> None:
    artifact = spill(owner=user)
    with django_assert_num_queries(1):
        assert visible_artifact(user=user, artifact_id=artifact.id) == artifact


def test_visible_artifact_hides_other_users_artifacts(user, other_user, staff_user) -> None:
    artifact = spill(owner=user)
    with pytest.raises(NotFound, match=artifact.id):
        visible_artifact(user=other_user, artifact_id=artifact.id)
    assert visible_artifact(user=staff_user, artifact_id=artifact.id) == artifact


def test_a_referencing_turn_grants_access_after_the_first_task_is_gone(user, other_user) -> None:
    artifact = spill(owner=user)
    assert spill(owner=other_user, text=SPILLED_TEXT) == artifact
    task_of(artifact).delete()  # the producing task goes; the other user's turn still points
    artifact.refresh_from_db()
    assert artifact.task_id is None
    assert visible_artifact(user=other_user, artifact_id=artifact.id) == artifact
    with pytest.raises(NotFound):
        visible_artifact(user=user, artifact_id=artifact.id)


def test_staff_see_orphaned_artifacts(user, staff_user) -> None:
    artifact = spill(owner=user)
    task_of(artifact).delete()
    assert visible_artifact(user=staff_user, artifact_id=artifact.id) == artifact
    with pytest.raises(NotFound):
        visible_artifact(user=user, artifact_id=artifact.id)
