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
    assert "8000" not in elsewhere
    assert is_executor_worker(worker_token.user)


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
