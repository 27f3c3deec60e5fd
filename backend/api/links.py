"""Absolute URLs the API hands out for content fetched on its own: an artifact's text, a turn's.

Built from the request being answered, so they name the host and scheme the client used.
"""

from __future__ import annotations

from django.urls import reverse
from rest_framework.request import Request


def artifact_download_url(*, request: Request, artifact_id: str) -> str:
    """Where the artifact's content is served."""
    return request.build_absolute_uri(
        reverse("artifact-content", kwargs={"artifact_id": artifact_id})
    )


def turn_text_url(*, request: Request, task_id: int, subtask_id: int) -> str:
    """Where a turn's spilled text is served whole (`views.TurnTextApi`)."""
    return request.build_absolute_uri(
        reverse("turn-text", kwargs={"task_id": task_id, "subtask_id": subtask_id})
    )
