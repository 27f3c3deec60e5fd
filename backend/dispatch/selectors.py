"""Selectors that read prompt reports: one report as the API shows it (with the steers its
claim was given), and the few columns that link each turn to the reports of its dispatches.

Who may read a report follows the task it was built for: whoever may see the task
(`backend.tasks.selectors.visible_tasks`: its owner, an operator with the tasks' view
permission), and the worker account the report's claim went to, which was handed the report
with the prompt. Anyone else gets NotFound, as for a task they may not see.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from django.contrib.auth.models import User
from django.db.models import F, Prefetch, Q, QuerySet

from backend.dispatch.models import PromptReport
from backend.errors import NotFound
from backend.tasks.models import Steer, Subtask
from backend.tasks.selectors import visible_tasks

# What a link to a report shows beside its turn: enough to tell a dispatch's prompts apart.
LINK_FIELDS = ("id", "subtask_id", "attempt", "worker_id", "kind", "sent", "created_at")

# Where `with_prompt_report_links` puts each turn's links, oldest first.
LINKS_ATTRIBUTE = "prompt_report_links"

# The columns replay reads and the API does not show.
_REPLAY_COLUMNS = ("policy_snapshot", "input_snapshot")


@dataclass(frozen=True)
class ReportSteer:
    """A follow-up given to the running turn of a report's claim (strategy steer)."""

    steer_id: int
    message_id: int  # its USER turn's, in the task
    status: str
    delivered_at: datetime | None
    fallback_reason: str


# Where `get_prompt_report` puts the steers of the report's (subtask, attempt), oldest first.
STEERS_ATTRIBUTE = "steers"


def get_prompt_report(*, user: User, report_id: int) -> PromptReport:
    """The report with its turn's `message_id` and, as `steers`, the `ReportSteer`s given to
    its claim (the turn's attempt it was built for), or NotFound when it does not exist or
    `user` may not read it (two queries: the report, then its claim's steers)."""
    report = (
        PromptReport.objects.filter(pk=report_id)
        .filter(Q(task__in=visible_tasks(user=user)) | Q(claimed_by=user))
        .defer(*_REPLAY_COLUMNS)
        .annotate(message_id=F("subtask__message_id"))
        .first()
    )
    if report is None:
        raise NotFound(f"Prompt report {report_id} does not exist.")
    steers = (
        Steer.objects.filter(target_id=report.subtask_id, attempt=report.attempt)
        .order_by("id")
        .values_list("id", "message__message_id", "status", "delivered_at", "fallback_reason")
    )
    setattr(report, STEERS_ATTRIBUTE, [ReportSteer(*row) for row in steers])
    return report


def with_prompt_report_links(turns: QuerySet[Subtask]) -> QuerySet[Subtask]:
    """`turns`, each with the links to its prompt reports as `prompt_report_links` (one more
    query per batch of turns read, however many turns and reports)."""
    links = PromptReport.objects.only(*LINK_FIELDS).order_by("created_at", "id")
    return turns.prefetch_related(
        Prefetch("prompt_reports", queryset=links, to_attr=LINKS_ATTRIBUTE)
    )
