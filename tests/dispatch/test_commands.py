"""Management commands: demo data, worker accounts, lease reclaim."""

from __future__ import annotations

import io
from datetime import timedelta

import pytest
from django.core.management import call_command
from django.utils import timezone
from rest_framework.authtoken.models import Token

from backend.dispatch.workers import is_executor_worker
from backend.tasks.models import Subtask, Task

pytestmark = pytest.mark.django_db


def run(*args: str) -> str:
    out = io.StringIO()
    call_command(*args, stdout=out)
    return out.getvalue()


def test_seed_demo_is_idempotent_and_prints_a_login(settings, tmp_path):
    settings.VAR_DIR = tmp_path
    first = run("seed_demo")
    second = run("seed_demo")
    assert "user admin  password" in first
    password = first.split("password ")[1].split()[0]
    assert f"password {password}" in second  # the same login on every run
    assert Task.objects.count() == 2
    group_chat = Task.objects.get(title__contains="release planning")
    assert group_chat.is_group_chat
    assert group_chat.subtasks.count() == 6
    pipeline = Task.objects.get(title__contains="flaky upload")
    assert len(pipeline.pipeline) == 2
    admin_token = Token.objects.get(user__username="admin").key
    worker_token = Token.objects.get(user__username="demo-worker")
    assert admin_token in first and worker_token.key in first
    # make run's worker reads the token from a file only this user may read.
    token_file = tmp_path / "demo-worker-token"
    assert token_file.read_text().strip() == worker_token.key
    assert token_file.stat().st_mode & 0o777 == 0o600
    # The bots the demo tasks name are registered.
    assert {step["bot"] for step in pipeline.pipeline} == {"coder", "reviewer"}
    assert "http://127.0.0.1:8000/admin/" in first
    elsewhere = run("seed_demo", "--base-url", "http://127.0.0.1:18765/")
    assert "http://127.0.0.1:18765/admin/" in elsewhere
    assert ":8000" not in elsewhere  # (a random token may hold the digits 8000)
    assert is_executor_worker(worker_token.user)


def test_seed_demo_seeds_the_tasks_the_readme_walks_through(settings, tmp_path):
    # The README's walkthrough creates task 3 and reads the demo's turns: the demo makes
    # exactly two tasks, one after the other (ids 1 and 2 on a fresh database; PostgreSQL's
    # sequences are not reset between tests), and their turns and texts are pinned.
    settings.VAR_DIR = tmp_path
    run("seed_demo")
    tasks = list(Task.objects.order_by("pk"))
    first = tasks[0].pk
    assert [(task.pk, task.title, task.task_type, task.is_group_chat) for task in tasks] == [
        (first, "Demo: release planning chat", "chat", True),
        (first + 1, "Demo: fix the flaky upload test", "code", False),
    ]
    fields = ("message_id", "parent_message_id", "role", "status", "sender", "bot", "history_text")
    turns = [list(task.subtasks.order_by("message_id").values_list(*fields)) for task in tasks]
    assert turns[0] == [
        (1, None, "USER", "COMPLETED", "alice", "", CHAT_QUESTION),
        (2, 1, "ASSISTANT", "COMPLETED", "", "planner", CHAT_ANSWER),
        (3, None, "USER", "COMPLETED", "bob", "", "I'll review the migration PR today."),
        (
            4,
            3,
            "ASSISTANT",
            "COMPLETED",
            "",
            "planner",
            "Thanks Bob. I'll draft the release notes.",
        ),
        (5, None, "USER", "COMPLETED", "alice", "", "Please list the open PRs by owner."),
        (6, 5, "ASSISTANT", "PENDING", "", "planner", ""),
    ]
    assert turns[1] == [
        (1, None, "USER", "COMPLETED", "carol", "", PIPELINE_QUESTION),
        (2, 1, "ASSISTANT", "COMPLETED", "", "coder", CODER_ANSWER),
        (3, 1, "ASSISTANT", "COMPLETED", "", "reviewer", REVIEWER_ANSWER),
        (4, None, "USER", "COMPLETED", "carol", "", "Good. Please also remove RETRY_DELAY."),
        (5, 4, "ASSISTANT", "PENDING", "", "coder", ""),
        (6, 4, "ASSISTANT", "PENDING", "", "reviewer", ""),
    ]
    assert Subtask.objects.get(task_id=first + 1, message_id=2).result == {"value": CODER_ANSWER}


CHAT_QUESTION = "Can we ship 2.4 on Friday? The changelog is in CHANGES.md."
CHAT_ANSWER = "Friday works if the migration note lands first; two PRs are still open."
PIPELINE_QUESTION = (
    "tests/test_upload.py::test_resume fails one run in ten. Find out why and fix it."
)
CODER_ANSWER = (
    "The test shares a temp dir with test_upload_large; the cleanup races. "
    "Gave each test its own tmp_path and removed the sleep."
)
REVIEWER_ANSWER = "Looks right. Also drop the now-unused RETRY_DELAY constant."


def test_create_worker_prints_and_rotates_its_token():
    token = run("create_worker", "worker-codex-1").strip()
    assert Token.objects.get(key=token).user.username == "worker-codex-1"
    assert run("create_worker", "worker-codex-1").strip() == token
    rotated = run("create_worker", "worker-codex-1", "--rotate").strip()
    assert rotated != token
    assert not Token.objects.filter(key=token).exists()


def test_reclaim_leases_command(user, worker):
    from backend.dispatch.claims import claim_turns
    from backend.tasks.services import PipelineStep, create_task

    create_task(
        owner=user,
        title="t",
        task_type="code",
        message="go",
        pipeline=[PipelineStep(executor="codex")],
    )
    [turn] = claim_turns(worker=worker, worker_id="w", kinds=["codex"], limit=1)
    Subtask.objects.filter(pk=turn.subtask.pk).update(
        lease_expires_at=timezone.now() - timedelta(seconds=1)
    )
    assert run("reclaim_leases").strip() == "requeued 1, failed 0"
    assert Subtask.objects.get(pk=turn.subtask.pk).status == "PENDING"
