"""Input and output serializers for the artifact API.

The outputs read Artifact rows: a manifest entry is what the dispatch payload lists per
artifact, and the metadata endpoint adds bookkeeping to it. Download URLs are absolute, built
from the request the serializer is given in its context (`{"request": request}`).
"""

from __future__ import annotations

import re

from rest_framework import serializers

from backend.api.links import artifact_download_urls
from backend.api.serializers import StrictQuery
from backend.artifacts.models import ARTIFACT_KIND_CHOICES, Artifact
from backend.artifacts.selectors import LineRange

LINES_PATTERN = re.compile(r"^(\d+)-(\d*)$")


class ArtifactManifestEntryOutput(serializers.Serializer[Artifact]):
    id = serializers.CharField()
    sha256 = serializers.CharField()
    kind = serializers.ChoiceField(choices=ARTIFACT_KIND_CHOICES)
    size_bytes = serializers.IntegerField()
    size_chars = serializers.IntegerField()
    size_lines = serializers.IntegerField()
    path = serializers.CharField(
        source="workspace_path", help_text="Where the executor finds the text in its workspace."
    )
    download_url = serializers.SerializerMethodField(help_text="GET it for the whole text.")

    def get_download_url(self, artifact: Artifact) -> str:
        # One serializer lists a whole manifest: resolve the URL once for all of its entries.
        urls = self.context.get("artifact_download_urls")
        if urls is None:
            urls = artifact_download_urls(request=self.context["request"])
            self.context["artifact_download_urls"] = urls
        return urls(artifact.id)


class ArtifactOutput(ArtifactManifestEntryOutput):
    task = serializers.IntegerField(
        source="task_id",
        allow_null=True,
        help_text="The task whose turn first produced this text.",
    )
    created_at = serializers.DateTimeField()
    last_read_at = serializers.DateTimeField(allow_null=True)


class ArtifactContentQuery(StrictQuery):
    """The content endpoint's query string: an optional line slice."""

    lines = serializers.CharField(
        required=False,
        help_text="START-END or START-: a 1-based, inclusive slice of lines.",
    )

    def validate_lines(self, value: str) -> LineRange:
        match = LINES_PATTERN.match(value)
        if match is None:
            raise serializers.ValidationError(
                "Use START-END or START- with 1-based line numbers (for example 10-20 or 10-)."
            )
        start = int(match.group(1))
        end = int(match.group(2)) if match.group(2) else None
        if start < 1:
            raise serializers.ValidationError("Line numbers start at 1.")
        if end is not None and end < start:
            raise serializers.ValidationError(f"END ({end}) is before START ({start}).")
        return LineRange(start=start, end=end)
