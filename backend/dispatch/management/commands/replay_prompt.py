"""Rebuild the prompt a past dispatch sent, from its PromptReport, and check it byte for byte.

    manage.py replay_prompt 1234          # does the rebuilt prompt's sha256 match?
                                          # (1234: a report's id, as the task API links it)
    manage.py replay_prompt 1234 --show   # ... and print the prompt

Exits 0 when the sha256 matches, 1 when it differs or the prompt cannot be rebuilt. Nothing is
written.
"""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from backend.dispatch.models import PromptReport
from backend.dispatch.replay import Replay, replay_prompt
from backend.tasks.models import message_name


def replay_summary(replay: Replay) -> str:
    """What the replay found, naming the turn the prompt was built for as Baton names turns
    everywhere ("task 3 message 7"), and the message it answered as what it replied to."""
    report = replay.report
    turn = report.subtask
    head = (
        f"prompt report {report.pk}: {turn.name_in_task} (subtask {turn.pk}), attempt "
        f"{report.attempt}, {report.kind} prompt, rendering rules "
        f"{report.builder_version or 'unrecorded'}\n"
        f"in reply to {message_name(turn.parent_message_id)}"
    )
    if replay.matches:
        return f"{head}\nsha256 matches: {replay.sha256}"
    if not replay.text:
        return f"{head}\ncannot replay: {replay.problem}"
    lines = [
        head,
        f"sha256 differs: recorded {report.prompt_sha256}, rebuilt {replay.sha256}",
    ]
    if replay.problem:
        lines.append(replay.problem)
    return "\n".join(lines)


class Command(BaseCommand):
    help = "Rebuild a past dispatch's prompt from its PromptReport and compare its sha256."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("report_id", type=int)
        parser.add_argument("--show", action="store_true", help="print the rebuilt prompt")

    def handle(self, *args: Any, **options: Any) -> None:
        report = (
            PromptReport.objects.select_related("subtask").filter(pk=options["report_id"]).first()
        )
        if report is None:
            raise CommandError(f"Prompt report {options['report_id']} does not exist.")
        replay = replay_prompt(report=report)
        self.stdout.write(replay_summary(replay))
        if options["show"] and replay.text:
            self.stdout.write("=== Prompt ===")
            self.stdout.write(replay.text, ending="")
        if not replay.matches:
            raise CommandError("The rebuilt prompt is not the one recorded.", returncode=1)
