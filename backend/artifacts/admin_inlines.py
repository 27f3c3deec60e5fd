"""The read-only list of artifacts shown on a task's admin page (`backend.tasks.admin` adds it).

Lists the artifacts the task first produced (`Artifact.task`); identical text recorded later by
another task stays listed under the first one.
"""

from __future__ import annotations

from django.contrib import admin
from django.db.models import Model
from django.urls import reverse
from django.utils.html import format_html

from backend.admin_mixins import ReadOnlyAdminMixin
from backend.artifacts.models import Artifact


def content_link(artifact: Artifact) -> str:
    """A link to the artifact's text through the API (admin sessions are accepted there)."""
    url = reverse("artifact-content", kwargs={"artifact_id": artifact.pk})
    return format_html('<a href="{}">content</a>', url)


class ArtifactInline(ReadOnlyAdminMixin, admin.TabularInline[Artifact, Model]):
    # Shown on a task's page; its parent is typed as any model because artifacts sit a layer
    # below tasks and do not import them.
    model = Artifact
    fk_name = "task"
    extra = 0
    ordering = ["created_at", "id"]
    # Every column is shown and none is editable (a tuple suits both attributes' types).
    fields = readonly_fields = (
        "id",
        "kind",
        "size_chars",
        "size_lines",
        "size_bytes",
        "created_at",
        "last_read_at",
        "content",
    )
    show_change_link = True

    @admin.display(description="Content")
    def content(self, artifact: Artifact) -> str:
        return content_link(artifact)
