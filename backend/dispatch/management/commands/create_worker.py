"""Create (or look up) an executor worker account and print its API token."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandParser

from backend.dispatch.workers import ensure_worker_account


class Command(BaseCommand):
    help = "Create an executor worker account (worker scope) and print its token."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("name", help="account name, e.g. worker-codex-1")
        parser.add_argument(
            "--rotate", action="store_true", help="replace the account's token with a new one"
        )

    def handle(self, *args: Any, name: str, rotate: bool, **options: Any) -> None:
        _, token = ensure_worker_account(username=name, rotate_token=rotate)
        self.stdout.write(token)
