"""Shared fixtures: users, authenticated API clients and the database switch."""

from __future__ import annotations

import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Permission
from django.db import connection
from hypothesis import HealthCheck
from hypothesis import settings as hypothesis_settings
from rest_framework.authtoken.models import Token
from rest_framework.test import APIClient

# Timing is not what property tests check: a loaded CI machine (or the first example loading a
# tiktoken encoding) must not turn into a DeadlineExceeded or a too_slow health check.
hypothesis_settings.register_profile(
    "baton", deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
hypothesis_settings.load_profile("baton")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    from django.conf import settings

    engine = settings.DATABASES["default"]["ENGINE"]
    if engine.endswith("postgresql"):
        return
    skip = pytest.mark.skip(reason="needs PostgreSQL (run with DATABASE_URL=postgres://...)")
    for item in items:
        if "postgres_only" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def artifact_storage_in_tmp(settings, tmp_path):
    """Every test writes artifacts to its own directory, never to var/."""
    settings.STORAGES = {
        **settings.STORAGES,
        "artifacts": {
            "BACKEND": "django.core.files.storage.FileSystemStorage",
            "OPTIONS": {"location": str(tmp_path / "artifacts")},
        },
    }
    return tmp_path / "artifacts"


@pytest.fixture
def no_progress_grace(monkeypatch):
    """A turn's progress events go the moment its attempt ends (no grace for live streams)."""
    from backend.tasks import task_events

    monkeypatch.setattr(task_events, "PROGRESS_GRACE_SECONDS", 0)


@pytest.fixture
def is_postgres() -> bool:
    return connection.vendor == "postgresql"


def pooled_connections_idle() -> int:
    """Connections this process's database pool holds for the next thread that asks (0
    without a pool): open on the server, but no thread's."""
    pool = getattr(connection, "pool", None)
    return 0 if pool is None else pool.get_stats()["pool_available"]


def pooled_connections_held() -> int:
    """Connections of this process's database pool that threads hold now."""
    pool = connection.pool
    assert pool is not None, "PostgreSQL's test settings pool their connections"
    stats = pool.get_stats()
    return stats["pool_size"] - stats["pool_available"]


@pytest.fixture
def user(db):
    return get_user_model().objects.create_user(username="alice", password="alice-password")


@pytest.fixture
def other_user(db):
    return get_user_model().objects.create_user(username="mallory", password="mallory-password")


@pytest.fixture
def superuser(db):
    return get_user_model().objects.create_superuser(
        username="root", password="root-password", email="root@example.com"
    )


@pytest.fixture
def admin_client(client, superuser):
    client.force_login(superuser)
    return client


# What the operator of the tests may do, as the admin grants it: read every task and artifact,
# read and edit history policies (the API asks the same model permissions).
OPERATOR_PERMISSIONS = [
    ("tasks", "view_task"),
    ("artifacts", "view_artifact"),
    ("dispatch", "view_historypolicy"),
    ("dispatch", "change_historypolicy"),
    ("dispatch", "add_historypolicy"),
]


@pytest.fixture
def staff_user(db):
    operator = get_user_model().objects.create_user(
        username="operator", password="operator-password", is_staff=True
    )
    for app_label, codename in OPERATOR_PERMISSIONS:
        operator.user_permissions.add(
            Permission.objects.get(content_type__app_label=app_label, codename=codename)
        )
    return operator


def token_client(user) -> APIClient:
    client = APIClient()
    token, _ = Token.objects.get_or_create(user=user)
    client.credentials(HTTP_AUTHORIZATION=f"Token {token.key}")
    return client


@pytest.fixture
def api(user) -> APIClient:
    return token_client(user)


@pytest.fixture
def other_api(other_user) -> APIClient:
    return token_client(other_user)


@pytest.fixture
def staff_api(staff_user) -> APIClient:
    return token_client(staff_user)


def make_worker(username: str):
    from backend.dispatch.workers import ensure_worker_account

    return ensure_worker_account(username=username)[0]


@pytest.fixture
def worker(db):
    return make_worker("worker-1")


@pytest.fixture
def worker_api(worker) -> APIClient:
    return token_client(worker)


@pytest.fixture
def other_worker_api(db) -> APIClient:
    return token_client(make_worker("worker-2"))


def register_bot(name: str, executor: str, **settings):
    """A registered bot, as an operator would add it in the admin."""
    from backend.tasks.models import Bot

    return Bot.objects.update_or_create(name=name, defaults={"executor": executor, **settings})[0]


@pytest.fixture
def shipped_bots(transactional_db):
    """The default bots the migrations ship, again: transactional tests flush every table."""
    import importlib

    from django.apps import apps

    from backend.tasks.models import Bot

    migration = importlib.import_module("backend.tasks.migrations.0006_shipped_bots")
    migration.create_shipped_bots(apps, None)
    return list(Bot.objects.filter(is_default=True))


@pytest.fixture
def pipeline_bots(db):
    """The bots the pipeline tests name: coder and builder on Codex, reviewer on Claude Code,
    planner and runner on Agno."""
    return {
        name: register_bot(name, executor)
        for name, executor in [
            ("coder", "codex"),
            ("builder", "codex"),
            ("reviewer", "claude_code"),
            ("planner", "agno"),
            ("runner", "agno"),
        ]
    }


@pytest.fixture
def model_server():
    """A model server of this test's own on 127.0.0.1 (Baton's stand-in model, scriptable),
    recording every request the executors make."""
    from executors.standin import ModelServer

    with ModelServer() as server:
        yield server
