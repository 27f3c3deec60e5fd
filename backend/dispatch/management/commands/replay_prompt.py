"""Rebuild the prompt a past dispatch sent, from its PromptReport, and check it byte for byte.

    manage.py replay_prompt 1234          # does the rebuilt prompt's sha256 match?
    manage.py replay_prompt 1234 --show   # ... and print the prompt

Exits 0 when the sha256 matches, 1 when it differs or the prompt cannot be rebuilt. Nothing is
written.
"""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from backend.dispatch.models import PromptReport
from backend.dispatch.replay import Replay, replay_prompt


def replay_summary(replay: Replay) -> str:
    report = replay.report
    head = (
        f"prompt report {report.pk}: task {report.task_id}, message "
        f"{report.input_snapshot.get('current', '?')}, attempt {report.attempt}, {report.kind} "
        f"prompt, rendering rules {report.builder_version or 'unrecorded'}"
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
        report = PromptReport.objects.filter(pk=options["report_id"]).first()
        if report is None:
            raise CommandError(f"Prompt report {options['report_id']} does not exist.")
        replay = replay_prompt(report=report)
        self.stdout.write(replay_summary(replay))
        if options["show"] and replay.text:
            self.stdout.write("=== Prompt ===")
            self.stdout.write(replay.text, ending="")
        if not replay.matches:
            raise CommandError("The rebuilt prompt is not the one recorded.", returncode=1)
