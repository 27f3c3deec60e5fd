"""Django admin for artifacts: browse, filter by kind, find by id or sha256, open the content.

Read-only: artifacts are written by ingestion and removed by `prune_artifacts`, which checks
that no turn references them; an admin deletion would bypass that and leave the file behind.
A composite artifact's page lists its parts in order (its content is theirs, one after the
other), each linked to its own page.
"""

from __future__ import annotations

from django.contrib import admin
from django.urls import reverse
from django.utils.html import format_html, format_html_join
from django.utils.safestring import mark_safe

from backend.admin_mixins import ReadOnlyAdminMixin
from backend.artifacts.admin_inlines import content_link
from backend.artifacts.models import Artifact


@admin.register(Artifact)
class ArtifactAdmin(ReadOnlyAdminMixin, admin.ModelAdmin[Artifact]):
    list_display = [
        "id",
        "kind",
        "size_chars",
        "size_lines",
        "size_bytes",
        "composite",
        "task_link",
        "created_at",
        "last_read_at",
        "content",
    ]
    list_filter = ["kind", "composite"]
    # Ids and hashes are hex prefixes of one another: a prefix search finds them by index.
    search_fields = ["^id", "^sha256"]
    list_select_related = ["task"]
    ordering = ["-created_at"]
    # Every column is shown and none is editable (a tuple suits both attributes' types).
    fields = readonly_fields = (
        "id",
        "sha256",
        "kind",
        "size_chars",
        "size_lines",
        "size_bytes",
        "composite",
        "parts",
        "task_link",
        "referencing_turns",
        "storage_key",
        "created_at",
        "last_read_at",
        "content",
    )

    @admin.display(description="Task", ordering="task")
    def task_link(self, artifact: Artifact) -> str:
        if artifact.task_id is None:
            return "-"
        url = reverse("admin:tasks_task_change", args=[artifact.task_id])
        return format_html('<a href="{}">{}</a>', url, artifact.task)

    @admin.display(description="Referencing turns")
    def referencing_turns(self, artifact: Artifact) -> int:
        return artifact.subtasks.count()

    @admin.display(description="Parts")
    def parts(self, artifact: Artifact) -> str:
        if not artifact.composite:
            return "-"
        links = artifact.part_links.select_related("part").order_by("position")
        return format_html_join(
            mark_safe("<br>"),
            '{}: <a href="{}">{}</a> ({} chars, {} lines, {} bytes)',
            (
                (
                    link.position,
                    reverse("admin:artifacts_artifact_change", args=[link.part_id]),
                    link.part_id,
                    link.part.size_chars,
                    link.part.size_lines,
                    link.part.size_bytes,
                )
                for link in links
            ),
        )

    @admin.display(description="Content")
    def content(self, artifact: Artifact) -> str:
        return content_link(artifact)
