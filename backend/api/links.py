"""Absolute URLs the API hands out for content fetched on its own: an artifact's text, a turn's.

Built from the request being answered, so they name the host and scheme the client used.
"""

from __future__ import annotations

from collections.abc import Callable

from django.urls import reverse
from rest_framework.request import Request

_ARTIFACT_ID = "artifact-id"


def artifact_download_url(*, request: Request, artifact_id: str) -> str:
    """Where the artifact's content is served."""
    return request.build_absolute_uri(
        reverse("artifact-content", kwargs={"artifact_id": artifact_id})
    )


def artifact_download_urls(*, request: Request) -> Callable[[str], str]:
    """`artifact_download_url` for the many artifacts one answer lists (a dispatch manifest
    names a file per earlier turn): the URL is resolved once and the id put in its place."""
    head, tail = artifact_download_url(request=request, artifact_id=_ARTIFACT_ID).rsplit(
        _ARTIFACT_ID, 1
    )
    return lambda artifact_id: f"{head}{artifact_id}{tail}"


def turn_text_url(*, request: Request, task_id: int, subtask_id: int) -> str:
    """Where a turn's spilled text is served whole (`views.TurnTextApi`)."""
    return request.build_absolute_uri(
        reverse("turn-text", kwargs={"task_id": task_id, "subtask_id": subtask_id})
    )


def prompt_report_url(*, request: Request, report_id: int) -> str:
    """Where a prompt report is served (`prompt_report_views.PromptReportDetailApi`)."""
    return request.build_absolute_uri(
        reverse("prompt-report-detail", kwargs={"report_id": report_id})
    )
