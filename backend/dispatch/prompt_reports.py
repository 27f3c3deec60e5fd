"""Prompt reports: the PromptReport row of each prompt a dispatch sends, and its log line.

A row records how the prompt was built (policy, counts, budget, what was cut) and what replay
needs (the policy and input snapshots, the prompt's digest); the `dispatch` log line is made
from the row's columns. Invariant: no prompt or result text reaches either (docs/architecture.md,
principle 7).
"""

from __future__ import annotations

from typing import Any

from django.contrib.auth.models import User

from backend.dispatch.budgets import budget_columns
from backend.dispatch.models import PromptReport
from backend.dispatch.overflow import overflow_columns
from backend.dispatch.prompts import TurnPrompt
from backend.events import EventValue, opaque_id
from backend.prompting import BUILDER_VERSION
from backend.prompting.addressing import content_sha256
from backend.tasks.history import input_snapshot
from backend.tasks.models import Subtask, SubtaskKind


def report_row(
    *,
    subtask: Subtask,
    worker: User,
    worker_id: str,
    prompt: TurnPrompt,
    kind: str,
    resume_reason: str,
) -> PromptReport:
    """The unsaved report row of `prompt`, a `kind` prompt ("full" or "resume") of `subtask`."""
    return PromptReport(
        subtask=subtask,
        task_id=subtask.task_id,
        attempt=subtask.attempts,
        worker_id=worker_id,
        claimed_by=worker,
        kind=kind,
        resume_reason=resume_reason,
        **overflow_columns(subtask),
        **build_columns(prompt, summary_job=subtask.kind == SubtaskKind.SUMMARY),
    )


def build_columns(prompt: TurnPrompt, *, summary_job: bool = False) -> dict[str, Any]:
    """The PromptReport columns a built prompt fills: the one place its report is copied.

    The row is made from these and the dispatch log line from the row's columns, so a column
    added here is stored and logged without a second copy.
    """
    report = prompt.build.report
    return {
        "policy": prompt.resolved.row,
        "policy_source": prompt.resolved.source,
        "policy_version": prompt.resolved.version,
        "history_enabled": prompt.resolved.policy.enabled,
        "context_passing": prompt.context_passing,
        "messages_considered": report.messages_considered,
        "messages_included": report.messages_included,
        "messages_omitted": report.messages_omitted,
        "omitted_user": report.omitted_user,
        "omitted_assistant": report.omitted_assistant,
        "included_message_ids": list(report.included_message_ids),
        "truncated": [item.model_dump(mode="json") for item in report.truncated],
        "truncated_count": (
            len(report.truncated) + report.current_truncated + report.previous_result_truncated
        ),
        "current_truncated": report.current_truncated,
        "current_removed_chars": report.current_removed_chars,
        "previous_result_truncated": report.previous_result_truncated,
        "previous_result_removed_chars": report.previous_result_removed_chars,
        "sections": list(report.sections),
        "chars": report.chars,
        "bytes": report.bytes,
        "tokens": report.tokens,
        "history_tokens": report.history_tokens,
        "current_tokens": report.current_tokens,
        "previous_result_tokens": report.previous_result_tokens,
        "note_tokens": report.note_tokens,
        "summary_first_message_id": report.summary_first_message_id,
        "summary_last_message_id": report.summary_last_message_id,
        "summary_tokens": report.summary_tokens,
        "token_encoding": report.token_encoding,
        **budget_columns(prompt.budget, counted_tokens=report.tokens),
        "artifacts": list(report.artifacts),
        "first_user_message_pinned": report.first_user_message_pinned,
        "build_ms": round(prompt.build_ms, 3),
        "token_budget": prompt.resolved.policy.max_tokens,
        "builder_version": BUILDER_VERSION,
        "policy_snapshot": prompt.resolved.policy.model_dump(mode="json"),
        "input_snapshot": {
            **input_snapshot(prompt.input, summary_job=summary_job),
            "transcript": prompt.transcript.snapshot() if prompt.transcript else None,
        },
        "prompt_sha256": content_sha256(prompt.build.text),
    }


# Columns a dispatch line leaves out: the row's own id and time, which prompt was sent (known
# only when the result comes back), and what replay needs (a digest of the prompt is not for
# logs, and the snapshots are structures, not counts).
_NOT_LOGGED = frozenset(
    {"id", "created_at", "sent", "policy_snapshot", "input_snapshot", "prompt_sha256"}
)


def dispatch_event(*, row: PromptReport, subtask: Subtask) -> dict[str, EventValue]:
    """The fields of a dispatch log line: every column of its PromptReport row (a foreign key
    by its id, a list by its length: counts, never the ids or titles themselves) and the
    turn's message id and executor. The worker id is the client's choice: logged opaque."""
    fields: dict[str, EventValue] = {
        "message_id": subtask.message_id,
        "executor": subtask.executor,
    }
    for column in PromptReport._meta.concrete_fields:
        if column.name in _NOT_LOGGED:
            continue
        value = getattr(row, column.attname)
        fields[column.name] = len(value) if isinstance(value, list) else value
    fields["worker_id"] = opaque_id(row.worker_id)
    return fields
