"""Load Baton's demo data and print an admin login and an API token.

Idempotent: the admin user, its password (kept in var/demo-admin-password) and the demo tasks are
created once and reused on later runs.
"""

from __future__ import annotations

import secrets
from typing import Any

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand
from rest_framework.authtoken.models import Token

from backend.dispatch.workers import ensure_worker_account
from backend.tasks.factories import answer_pending, answered_task
from backend.tasks.models import Bot, Task
from backend.tasks.services import PipelineStep, append_message

ADMIN_USERNAME = "admin"
DEMO_WORKER_USERNAME = "demo-worker"
GROUP_CHAT_TITLE = "Demo: release planning chat"
PIPELINE_TITLE = "Demo: fix the flaky upload test"
# The bots the demo tasks name, beside the shipped default bot of each executor.
DEMO_BOTS = [
    {
        "name": "planner",
        "executor": "agno",
        "model": "gpt-5.5",
        "instructions": "You help a team plan releases. Answer briefly.",
    },
    {
        "name": "coder",
        "executor": "codex",
        "model": "gpt-5.5",
        "instructions": "Fix what is asked with the smallest change; run the tests.",
    },
    {
        "name": "reviewer",
        "executor": "claude_code",
        "model": "claude-sonnet-4-5",
        "instructions": "Review the previous step's change; point out what is missing.",
        "permission_mode": "read_only",
    },
]


class Command(BaseCommand):
    help = "Create the demo admin user, an API token and two demo tasks; print the login."

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument(
            "--base-url",
            default="http://127.0.0.1:8000",
            help="where the server will listen, for the URLs printed (make run passes its own)",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        base_url = options["base_url"].rstrip("/")
        password_file = settings.VAR_DIR / "demo-admin-password"
        if password_file.exists():
            password = password_file.read_text().strip()
        else:
            password = secrets.token_urlsafe(12)
            password_file.write_text(password + "\n")
            password_file.chmod(0o600)
        user_model = get_user_model()
        admin, _ = user_model.objects.get_or_create(
            username=ADMIN_USERNAME, defaults={"is_staff": True, "is_superuser": True}
        )
        admin.is_staff = admin.is_superuser = True
        admin.set_password(password)
        admin.save()
        token, _ = Token.objects.get_or_create(user=admin)
        _, worker_token = ensure_worker_account(username=DEMO_WORKER_USERNAME)
        # `make run` starts a worker beside the server with this token.
        token_file = settings.VAR_DIR / "demo-worker-token"
        token_file.write_text(worker_token + "\n")
        token_file.chmod(0o600)
        for bot in DEMO_BOTS:
            Bot.objects.get_or_create(name=bot["name"], defaults=bot)

        if not Task.objects.filter(title=GROUP_CHAT_TITLE).exists():
            self._group_chat(admin)
        if not Task.objects.filter(title=PIPELINE_TITLE).exists():
            self._pipeline(admin)

        self.stdout.write(
            "\nBaton demo is ready.\n"
            f"  Admin:     {base_url}/admin/\n"
            f"             user {ADMIN_USERNAME}  password {password}\n"
            f"  API token: {token.key}\n"
            "  Try:       curl -H 'Authorization: Token "
            f"{token.key}' {base_url}/api/tasks/\n"
            f"  Worker token (executor API): {worker_token}\n"
            f"  API docs:  {base_url}/api/docs/\n"
            "  A worker runs beside the server (make run); with no model keys it answers with\n"
            "  Baton's stand-in model.\n"
        )

    def _group_chat(self, owner: Any) -> None:
        task = answered_task(
            owner=owner,
            title=GROUP_CHAT_TITLE,
            task_type="chat",
            message="Can we ship 2.4 on Friday? The changelog is in CHANGES.md.",
            answer="Friday works if the migration note lands first; two PRs are still open.",
            pipeline=[PipelineStep(bot="planner", executor="agno")],
            sender="alice",
            is_group_chat=True,
        )
        append_message(task=task, message="I'll review the migration PR today.", sender="bob")
        answer_pending(task=task, answer="Thanks Bob. I'll draft the release notes.")
        append_message(task=task, message="Please list the open PRs by owner.", sender="alice")

    def _pipeline(self, owner: Any) -> None:
        task = answered_task(
            owner=owner,
            title=PIPELINE_TITLE,
            task_type="code",
            message=(
                "tests/test_upload.py::test_resume fails one run in ten. Find out why and fix it."
            ),
            answer=(
                # The coder's answer, then the reviewer's.
                "The test shares a temp dir with test_upload_large; the cleanup races. "
                "Gave each test its own tmp_path and removed the sleep.",
                "Looks right. Also drop the now-unused RETRY_DELAY constant.",
            ),
            pipeline=[
                PipelineStep(bot="coder", executor="codex"),
                PipelineStep(bot="reviewer", executor="claude_code"),
            ],
            sender="carol",
        )
        append_message(task=task, message="Good. Please also remove RETRY_DELAY.", sender="carol")
