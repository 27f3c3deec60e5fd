"""Send pending webhook deliveries, in a loop (`--once`: one pass).

A separate process beside the web server; several may run at once (they claim different
deliveries). Sending never happens inside a request or a dispatch transaction.
"""

from __future__ import annotations

import time
from typing import Any

from django.core.management.base import BaseCommand, CommandParser
from django.db import close_old_connections

from backend.webhooks.sender import deliver_due, http_client


class Command(BaseCommand):
    help = "Send pending webhook deliveries, retrying failures with backoff."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--once", action="store_true", help="One pass, then exit.")
        parser.add_argument(
            "--interval",
            type=float,
            default=1.0,
            help="Seconds to wait after a pass that found nothing due (default 1).",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        with http_client() as client:
            if options["once"]:
                summary = deliver_due(client=client)
                self.stdout.write(
                    f"delivered {summary.delivered}, retrying {summary.retrying}, "
                    f"failed {summary.failed}"
                )
                return
            try:
                while True:
                    close_old_connections()
                    if not deliver_due(client=client).sent:
                        time.sleep(options["interval"])
            except KeyboardInterrupt:
                return
