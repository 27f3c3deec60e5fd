"""Artifact selectors: who may see an artifact, and the dispatch manifest (one query each)."""

from __future__ import annotations

import pytest

from backend.artifacts.models import Artifact
from backend.artifacts.selectors import artifact_manifest
from backend.errors import NotFound
from backend.tasks.artifact_access import visible_artifact
from tests.artifacts.conftest import SPILLED_TEXT, spill, task_of

pytestmark = pytest.mark.django_db


def manifest_entry(artifact: Artifact, base: str = "") -> dict:
    return {
        "id": artifact.id,
        "sha256": artifact.sha256,
        "kind": artifact.kind,
        "size_bytes": artifact.size_bytes,
        "size_chars": artifact.size_chars,
        "size_lines": artifact.size_lines,
        "path": f".baton/artifacts/{artifact.id}.txt",
        "download_url": f"{base}/api/artifacts/{artifact.id}/content/",
    }


@pytest.fixture
def three_artifacts(user) -> list[Artifact]:
    return [spill(owner=user, text=f"{index}\n" + "x" * 20_000) for index in range(3)]


def test_manifest_keeps_the_order_given_in_one_query(
    three_artifacts, django_assert_num_queries
) -> None:
    first, second, third = three_artifacts
    ids = [third.id, first.id, second.id, first.id]  # a repeated id is listed once
    with django_assert_num_queries(1):
        manifest = artifact_manifest(artifact_ids=ids)
    assert manifest == [manifest_entry(third), manifest_entry(first), manifest_entry(second)]


def test_manifest_urls_are_absolute_under_a_base_url(three_artifacts) -> None:
    first = three_artifacts[0]
    for base in ("https://baton.example.com", "https://baton.example.com/"):
        manifest = artifact_manifest(artifact_ids=[first.id], request_base_url=base)
        assert manifest == [manifest_entry(first, "https://baton.example.com")]


def test_empty_manifest_costs_no_query(django_assert_num_queries) -> None:
    with django_assert_num_queries(0):
        assert artifact_manifest(artifact_ids=[]) == []


def test_manifest_with_an_unknown_id_names_it(three_artifacts) -> None:
    with pytest.raises(NotFound, match="0123456789abcdef"):
        artifact_manifest(artifact_ids=[three_artifacts[0].id, "0123456789abcdef"])


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
