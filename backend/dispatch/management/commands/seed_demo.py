"""Load Baton's demo data and print an admin login and an API token.

Idempotent: the admin user, its password (kept in var/demo-admin-password) and the demo tasks are
created once and reused on later runs. The worker's token is kept in var/demo-worker-token, and
the whole login — the admin's password, their API token, the worker's token — in var/demo-login
(each readable by its owner only).

`--login-when-up` loads nothing: it waits until the server at `--base-url` answers its health
check, then prints the login kept in var/demo-login. `make run` loads the demo with
`--verbosity 0` (no login printed then) and runs this beside the server, so the login is printed
once, the last thing on the console once the server is up, not scrolled away by the lines the
worker's first turns write.
"""

from __future__ import annotations

import secrets
import time
from pathlib import Path
from typing import Any

import httpx
from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError
from rest_framework.authtoken.models import Token

from backend.dispatch.workers import ensure_worker_account
from backend.executor_kinds import KINDS
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
        "model": KINDS["agno"].default_model,
        "instructions": "You help a team plan releases. Answer briefly.",
    },
    {
        "name": "coder",
        "executor": "codex",
        "model": KINDS["codex"].default_model,
        "instructions": "Fix what is asked with the smallest change; run the tests.",
    },
    {
        "name": "reviewer",
        "executor": "claude_code",
        "model": KINDS["claude_code"].default_model,
        "instructions": "Review the previous step's change; point out what is missing.",
        "permission_mode": "read_only",
    },
]


# --login-when-up: how long to wait for the server, and between tries.
LOGIN_WAIT_SECONDS = 300.0
LOGIN_POLL_SECONDS = 0.25


class Command(BaseCommand):
    help = "Create the demo admin user, an API token and two demo tasks; print the login."

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument(
            "--base-url",
            default="http://127.0.0.1:8000",
            help="where the server will listen, for the URLs printed (make run passes its own)",
        )
        parser.add_argument(
            "--login-when-up",
            action="store_true",
            help="load nothing: wait until the server at --base-url answers, then print the "
            "login kept in var/demo-login (make run does, beside the server)",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        base_url = options["base_url"].rstrip("/")
        login_file = settings.VAR_DIR / "demo-login"
        if options["login_when_up"]:
            self._print_when_up(base_url=base_url, login_file=login_file)
            return
        password_file = settings.VAR_DIR / "demo-admin-password"
        if password_file.exists():
            password = password_file.read_text().strip()
        else:
            password = secrets.token_urlsafe(12)
            _write_private(password_file, password + "\n")
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
        _write_private(token_file, worker_token + "\n")
        for bot in DEMO_BOTS:
            Bot.objects.get_or_create(name=bot["name"], defaults=bot)

        if not Task.objects.filter(title=GROUP_CHAT_TITLE).exists():
            self._group_chat(admin)
        if not Task.objects.filter(title=PIPELINE_TITLE).exists():
            self._pipeline(admin)

        login = (
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
            f"  Kept in:   {_shown(login_file)} (the password also in {_shown(password_file)},\n"
            f"             the worker token in {_shown(token_file)})\n"
        )
        _write_private(login_file, login)
        if options["verbosity"] >= 1:  # `make run` prints it once, when the server is up
            self.stdout.write(login)

    def _print_when_up(self, *, base_url: str, login_file: Path) -> None:
        """Print the kept login once the server answers GET /api/health/ (any answer but a
        transient one: a server that answers is up, whatever its health says)."""
        if not login_file.exists():
            raise CommandError(f"{login_file} is missing: run manage.py seed_demo first")
        deadline = time.monotonic() + LOGIN_WAIT_SECONDS
        with httpx.Client(timeout=httpx.Timeout(5.0, connect=1.0)) as client:
            while time.monotonic() < deadline:
                try:
                    answer = client.get(f"{base_url}/api/health/")
                except httpx.TransportError:
                    time.sleep(LOGIN_POLL_SECONDS)
                    continue
                if answer.status_code not in (502, 503, 504):
                    self.stdout.write(login_file.read_text(encoding="utf-8"))
                    return
                time.sleep(LOGIN_POLL_SECONDS)
        self.stderr.write(
            f"The server at {base_url} did not answer; the demo login is in {_shown(login_file)}."
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


def _write_private(path: Path, text: str) -> None:
    """Write `text` to `path`, readable by its owner only (it holds a password or a token)."""
    path.touch(mode=0o600, exist_ok=True)
    path.chmod(0o600)
    path.write_text(text, encoding="utf-8")


def _shown(path: Path) -> Path:
    """`path` as printed: relative to the checkout when it is inside it (var/…)."""
    base = Path(settings.BASE_DIR)
    return path.relative_to(base) if path.is_relative_to(base) else path
