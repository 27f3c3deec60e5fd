"""Print the prompt a turn's dispatch would send, its report and a token budget bar.

The terminal twin of the admin's prompt preview page (same `preview_prompt` selector): try caps
on a real turn before saving them, e.g.

    manage.py preview_prompt 42 --policy-json '{"max_messages": 3}'

Values in --policy-json override the policy dispatch resolves for the task's type. Nothing is
written: no claim, no prompt report, no policy change.
"""

from __future__ import annotations

import json
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from backend.dispatch.preview import BudgetSegment, PromptPreview, preview_prompt
from backend.errors import BatonError
from backend.tasks.models import Subtask, message_name

BAR_WIDTH = 60
BAR_CHARS = {
    "history": "H",
    "current": "C",
    "previous_result": "P",
    "structure": "#",
    "unused": ".",
}


def budget_bar(segments: tuple[BudgetSegment, ...], *, width: int = BAR_WIDTH) -> str:
    """`[HHHHCCCPP....]` with each segment's width by its share (largest remainder rounding)."""
    exact = [segment.share * width for segment in segments]
    cells = [int(value) for value in exact]
    by_remainder = sorted(range(len(exact)), key=lambda i: exact[i] - cells[i], reverse=True)
    for index in by_remainder[: width - sum(cells)] if segments else []:
        cells[index] += 1
    bar = "".join(BAR_CHARS[s.name] * n for s, n in zip(segments, cells, strict=True))
    return f"[{bar}]"


def render_preview(preview: PromptPreview) -> str:
    report = preview.report
    subtask = preview.subtask
    truncated = [
        f"message {item.message_id}: {item.removed_chars} of {item.original_chars} chars removed"
        for item in report.truncated
    ]
    if report.current_truncated:
        truncated.append(f"current message: {report.current_removed_chars} chars removed")
    if report.previous_result_truncated:
        truncated.append(f"previous result: {report.previous_result_removed_chars} chars removed")
    max_tokens = f" of max {preview.max_tokens}" if preview.max_tokens else ""
    lines = [
        "=== Prompt ===",
        preview.text,
        "=== Report ===",
        f"task: {preview.task.pk} ({preview.task.task_type})",
        f"turn: {subtask.name_in_task} (subtask {subtask.pk}, {subtask.status}), "
        f"in reply to {message_name(subtask.parent_message_id)}",
        f"policy: {preview.policy_label}",
    ]
    if preview.kill_switch:
        lines.append("kill switch: EXECUTOR_HISTORY_ENABLED is false, history is off")
    lines += [
        f"history: {'on' if preview.resolved.policy.enabled else 'off'}; "
        f"context passing {preview.turn_prompt.context_passing}",
        "sections: " + (", ".join(report.sections) if not report.verbatim else "none (verbatim)"),
        f"messages: {report.messages_considered} considered, {report.messages_included} "
        f"included, {report.messages_omitted} omitted ({report.omitted_user} user, "
        f"{report.omitted_assistant} assistant)",
        "truncated: " + ("; ".join(truncated) or "none"),
        f"size: {report.chars} chars, {report.tokens} tokens ({report.token_encoding})"
        + max_tokens,
        "artifacts: " + (", ".join(report.artifacts) or "none"),
        f"first user message pinned: {'yes' if report.first_user_message_pinned else 'no'}",
        f"build time: {preview.turn_prompt.build_ms:.2f} ms",
        "=== Token budget ===",
        budget_bar(preview.budget),
    ]
    lines += [
        f"  {BAR_CHARS[s.name]} {s.label}: {s.tokens} tokens ({s.width_css})"
        for s in preview.budget
    ]
    marks = ", ".join(
        f"{turn.message_id} {turn.role} {turn.mark}" for turn in reversed(preview.history_turns)
    )
    lines.append("history turns: " + (marks or "none"))
    if preview.history_turns_not_listed:
        lines.append(f"  ({preview.history_turns_not_listed} older turns not listed)")
    return "\n".join(lines)


class Command(BaseCommand):
    help = (
        "Print the prompt the dispatch of an ASSISTANT turn would send, its report and a token "
        "budget bar, optionally with policy values overridden by --policy-json. Writes nothing."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "subtask_id",
            type=int,
            help="Subtask id of the ASSISTANT turn (its `id` in the task API).",
        )
        parser.add_argument(
            "--policy-json",
            default=None,
            help="Cap values overriding the resolved policy, e.g. '{\"max_messages\": 3}'.",
        )

    def handle(self, *args: Any, subtask_id: int, policy_json: str | None, **options: Any) -> None:
        values = None
        if policy_json is not None:
            try:
                values = json.loads(policy_json)
            except json.JSONDecodeError as error:
                raise CommandError(f"--policy-json is not valid JSON: {error}") from None
            if not isinstance(values, dict):
                raise CommandError("--policy-json must be a JSON object of policy fields.")
        subtask = Subtask.objects.select_related("task").filter(pk=subtask_id).first()
        if subtask is None:
            raise CommandError(f"No subtask {subtask_id}.")
        try:
            preview = preview_prompt(task=subtask.task, values_or_row=values, subtask=subtask)
        except BatonError as error:
            raise CommandError(error.message) from None
        self.stdout.write(render_preview(preview))
