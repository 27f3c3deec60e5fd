"""The prompt report API: what one prompt a dispatch built, for whoever may read its task.

Each assistant turn of the task API links its reports (`prompt_reports`); a report names its
turn by `subtask_id` and `message_id`, and its `id` is what `manage.py replay_prompt ID` takes
to rebuild the prompt and check it byte for byte.
"""

from __future__ import annotations

from drf_spectacular.utils import extend_schema
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from backend.api.permissions import authenticated_user
from backend.api.serializers.reports import PromptReportOutput
from backend.dispatch.selectors import get_prompt_report


class PromptReportDetailApi(APIView):
    """A report the caller may read: of a task they may see (its owner, an operator with the
    tasks' view permission), or one their worker account's claim was handed; else 404."""

    @extend_schema(
        operation_id="prompt_reports_retrieve",
        responses=PromptReportOutput,
        summary="A prompt report: what one prompt of a dispatch held, without its text",
    )
    def get(self, request: Request, report_id: int) -> Response:
        report = get_prompt_report(user=authenticated_user(request), report_id=report_id)
        return Response(PromptReportOutput(report).data)
