"""The artifact admin pages and the task-page inline render for a staff superuser."""

from __future__ import annotations

import pytest
from django.contrib import admin
from django.test import RequestFactory

from backend.artifacts.admin_inlines import ArtifactInline
from backend.tasks.models import Task
from tests.artifacts.conftest import spill

pytestmark = pytest.mark.django_db


def test_changelist_lists_artifacts_with_links(client, superuser, user) -> None:
    artifact = spill(owner=user)
    client.force_login(superuser)
    response = client.get("/admin/artifacts/artifact/")
    assert response.status_code == 200
    page = response.content.decode()
    assert artifact.id in page
    assert f"/api/artifacts/{artifact.id}/content/" in page
    assert f"/admin/tasks/task/{artifact.task_id}/change/" in page


def test_changelist_filters_and_searches(client, superuser, user) -> None:
    artifact = spill(owner=user)
    client.force_login(superuser)
    assert client.get("/admin/artifacts/artifact/", {"kind": "text"}).status_code == 200
    response = client.get("/admin/artifacts/artifact/", {"q": artifact.sha256[:20]})
    assert response.status_code == 200
    assert artifact.id in response.content.decode()


def test_change_page_is_read_only(client, superuser, user) -> None:
    artifact = spill(owner=user)
    client.force_login(superuser)
    response = client.get(f"/admin/artifacts/artifact/{artifact.id}/change/")
    assert response.status_code == 200
    page = response.content.decode()
    assert artifact.sha256 in page
    assert f"/api/artifacts/{artifact.id}/content/" in page
    assert 'name="_save"' not in page
    assert client.get("/admin/artifacts/artifact/add/").status_code == 403
    assert client.get(f"/admin/artifacts/artifact/{artifact.id}/delete/").status_code == 403


def test_artifact_inline_lists_a_tasks_artifacts(superuser, user) -> None:
    artifact = spill(owner=user)
    site = admin.AdminSite(name="inline_test")

    class TaskWithArtifacts(admin.ModelAdmin):
        inlines = [ArtifactInline]

    site.register(Task, TaskWithArtifacts)
    request = RequestFactory().get("/")
    request.user = superuser
    model_admin = site._registry[Task]
    formsets = list(model_admin.get_formsets_with_inlines(request, Task.objects.get()))
    assert len(formsets) == 1
    formset_class, inline = formsets[0]
    formset = formset_class(instance=Task.objects.get(pk=artifact.task_id))
    assert [form.instance for form in formset.forms] == [artifact]
    assert not inline.has_add_permission(request, None)
    assert not inline.has_change_permission(request, None)
    assert not inline.has_delete_permission(request, None)
    assert f"/api/artifacts/{artifact.id}/content/" in inline.content(artifact)
