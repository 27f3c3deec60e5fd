"""Artifacts: the whole text of long messages and results, stored once, addressed by content.

The id is a prefix of the content's sha256, so the same text recorded twice is one artifact and
renders as the same pointer line in every later prompt (docs/architecture.md, principle 5). Content
lives in the `artifacts` storage (filesystem under var/artifacts by default; any Django storage
backend, such as S3-compatible object storage through django-storages, by setting).
"""

from __future__ import annotations

from django.db import models

from backend.prompting.addressing import ARTIFACT_ID_LENGTH, workspace_path
from backend.prompting.kinds import ArtifactKind

# The kinds are the prompt core's (they appear in pointer lines); these are their labels.
ARTIFACT_KIND_CHOICES = [
    (ArtifactKind.JSON.value, "JSON"),
    (ArtifactKind.WEB_OR_SEARCH.value, "Web page or search results"),
    (ArtifactKind.COMMAND_OUTPUT.value, "Command output"),
    (ArtifactKind.FILE_OR_CODE.value, "File, code or diff"),
    (ArtifactKind.TEXT.value, "Text"),
    (ArtifactKind.TRANSCRIPT.value, "Conversation transcript"),
]


class Artifact(models.Model):
    id = models.CharField(primary_key=True, max_length=ARTIFACT_ID_LENGTH)
    sha256 = models.CharField(max_length=64, unique=True)
    storage_key = models.CharField(max_length=255)
    size_chars = models.BigIntegerField()
    size_bytes = models.BigIntegerField()
    size_lines = models.BigIntegerField()
    kind = models.CharField(max_length=20, choices=ARTIFACT_KIND_CHOICES)
    # The task whose turn first produced this text; later identical texts share the artifact.
    task = models.ForeignKey(
        "tasks.Task", on_delete=models.SET_NULL, null=True, blank=True, related_name="artifacts"
    )
    created_at = models.DateTimeField(auto_now_add=True)
    last_read_at = models.DateTimeField(null=True, blank=True)
    # A composite artifact stores no file of its own: its content is its parts' contents in
    # order (`ArtifactPart`), its sha256 the digest of their sha256s (`composite_sha256`), and
    # its sizes their sums. A long task's transcript is one: the parts sealed once never
    # change, so a dispatch stores only the newest part (backend.tasks.transcripts.storing).
    composite = models.BooleanField(default=False)

    class Meta:
        ordering = ["-created_at"]
        indexes = [models.Index(fields=["created_at"], name="artifact_created")]

    def __str__(self) -> str:
        return f"{self.id} ({self.kind}, {self.size_chars} chars)"

    @property
    def workspace_path(self) -> str:
        """Where an executor finds the whole text inside its workspace."""
        return workspace_path(self.id)


class ArtifactPart(models.Model):
    """One part of a composite artifact, at its position (0 first)."""

    # Indexed by `artifact_part_position_unique`, which leads with it.
    composite = models.ForeignKey(
        Artifact, on_delete=models.CASCADE, related_name="part_links", db_index=False
    )
    # A part outlives no composite that lists it: pruning skips it while one does.
    part = models.ForeignKey(Artifact, on_delete=models.PROTECT, related_name="composite_links")
    position = models.PositiveIntegerField()

    class Meta:
        ordering = ["composite", "position"]
        constraints = [
            models.UniqueConstraint(
                fields=["composite", "position"], name="artifact_part_position_unique"
            )
        ]

    def __str__(self) -> str:
        return f"{self.composite_id}[{self.position}] = {self.part_id}"
