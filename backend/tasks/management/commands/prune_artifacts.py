"""Remove artifacts that no turn references any more and that nobody has read for a while, and
stored files that no artifact owns.

    manage.py prune_artifacts --older-than 30 [--dry-run]

Prints one line per artifact (id, kind, bytes) and a total, then one line per orphan file
(storage key, bytes) and a total. Artifacts referenced by any turn are never removed, however
old; see `backend.tasks.artifact_retention`. Orphan files (left by rolled-back or failed writes
and crashes) go once they are older than BATON_ARTIFACT_ORPHAN_GRACE_SECONDS; see
`backend.artifacts.retention.remove_orphan_files`.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, CommandParser

from backend.artifacts.retention import OrphanFile, PrunedArtifact, remove_orphan_files
from backend.tasks.artifact_retention import prune_artifacts


class Command(BaseCommand):
    help = (
        "Remove artifacts no turn references that were created and last read more than DAYS "
        "days ago (rows and stored files), and stored files no artifact owns that are older "
        "than BATON_ARTIFACT_ORPHAN_GRACE_SECONDS; print what was removed."
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
        verb = "would remove" if dry_run else "removed"
        pruned = prune_artifacts(older_than=timedelta(days=days), dry_run=dry_run)
        for artifact in pruned:
            self.stdout.write(f"{verb} {artifact.id} {artifact.kind} {artifact.size_bytes} bytes")
        self._summary(f"{len(pruned)} artifacts", pruned, dry_run=dry_run)
        orphans = remove_orphan_files(
            older_than=timedelta(seconds=settings.BATON_ARTIFACT_ORPHAN_GRACE_SECONDS),
            dry_run=dry_run,
        )
        for orphan in orphans:
            self.stdout.write(f"{verb} orphan file {orphan.storage_key} {orphan.size_bytes} bytes")
        self._summary(f"{len(orphans)} orphan files", orphans, dry_run=dry_run)

    def _summary(
        self, what: str, removed: Sequence[PrunedArtifact | OrphanFile], *, dry_run: bool
    ) -> None:
        verb = "Would remove" if dry_run else "Removed"
        summary = f"{verb} {what}, {sum(item.size_bytes for item in removed)} bytes"
        if dry_run:
            summary += " (dry run: nothing was removed)"
        self.stdout.write(self.style.SUCCESS(summary) if removed else summary)
