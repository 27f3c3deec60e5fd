"""Requeue (or, after the last attempt, fail) turns whose executor lease has expired.

Dispatch does this on every call; this command is for operators who want it on a schedule
or by hand.
"""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand

from backend.dispatch.leases import reclaim_expired_leases


class Command(BaseCommand):
    help = "Requeue turns whose executor lease expired; fail them after BATON_MAX_ATTEMPTS."

    def handle(self, *args: Any, **options: Any) -> None:
        total_requeued = total_failed = 0
        while True:
            summary = reclaim_expired_leases()
            total_requeued += summary.requeued
            total_failed += summary.failed
            if not summary.requeued and not summary.failed:
                break
        self.stdout.write(f"requeued {total_requeued}, failed {total_failed}")
