"""Remove artifacts that no turn references any more and that nobody has read for a while.

    manage.py prune_artifacts --older-than 30 [--dry-run]

Prints one line per artifact (id, kind, bytes) and a total. Artifacts referenced by any turn
are never removed, however old; see `backend.tasks.artifact_retention`.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from backend.tasks.artifact_retention import prune_artifacts


class Command(BaseCommand):
    help = (
        "Remove artifacts no turn references that were created and last read more than DAYS "
        "days ago (rows and stored files); print what was removed."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--older-than",
            type=int,
            required=True,
            metavar="DAYS",
            help="Only artifacts created and last read more than DAYS days ago.",
        )
        parser.add_argument(
            "--dry-run",
            action="store_true",
            help="List what would be removed without removing anything.",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        days = options["older_than"]
        if days < 0:
            raise CommandError("--older-than must be 0 or more days.")
        dry_run = options["dry_run"]
        pruned = prune_artifacts(older_than=timedelta(days=days), dry_run=dry_run)
        verb = "would remove" if dry_run else "removed"
        for artifact in pruned:
            self.stdout.write(f"{verb} {artifact.id} {artifact.kind} {artifact.size_bytes} bytes")
        total_bytes = sum(artifact.size_bytes for artifact in pruned)
        summary = f"{verb.capitalize()} {len(pruned)} artifacts, {total_bytes} bytes"
        if dry_run:
            summary += " (dry run: nothing was removed)"
        self.stdout.write(self.style.SUCCESS(summary) if pruned else summary)
