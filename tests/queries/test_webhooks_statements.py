"""`endpoints_hearing_task` (backend/queries/webhooks.sql) against real PostgreSQL, with the
ORM's query SQLite runs as its oracle: the same endpoints, in the same order, with the events
each hears."""

from __future__ import annotations

import pytest

from backend.tasks.services import PipelineStep, create_task
from backend.webhooks import services
from backend.webhooks.models import WebhookEndpoint

pytestmark = [
    pytest.mark.postgres_only,
    pytest.mark.django_db,
    pytest.mark.usefixtures("pipeline_bots"),
]


def _task(owner, title: str):
    return create_task(
        owner=owner,
        title=title,
        task_type="code",
        message="hello",
        pipeline=[PipelineStep(executor="codex")],
    )


def _endpoint(owner, *, task=None, events=None, active=True) -> WebhookEndpoint:
    endpoint = services.create_endpoint(
        owner=owner, url="https://hooks.example.com/baton", task_id=task and task.pk, events=events
    )
    if not active:
        WebhookEndpoint.objects.filter(pk=endpoint.pk).update(active=False)
    return endpoint


def test_the_statement_reads_what_the_orm_reads(user, other_user):
    mine, other = _task(user, "mine"), _task(user, "other")
    theirs = _task(other_user, "theirs")
    every_task = _endpoint(user, events=["turn.completed"])
    this_task = _endpoint(user, task=mine)
    _endpoint(user, task=other)  # another task's
    _endpoint(user, active=False)  # switched off
    _endpoint(other_user)  # another owner's
    _endpoint(other_user, task=theirs)
    newest = _endpoint(user, events=["turn.failed", "turn.completed"])

    by_statement = services._endpoints_hearing(owner_id=user.pk, task_id=mine.pk)
    assert by_statement == services._endpoints_by_orm(owner_id=user.pk, task_id=mine.pk)
    assert by_statement == [
        (newest.pk, newest.events),
        (this_task.pk, this_task.events),
        (every_task.pk, ["turn.completed"]),
    ]


def test_an_owner_without_endpoints_reads_none(user, other_user):
    _endpoint(other_user)
    task = _task(user, "quiet")
    assert services._endpoints_hearing(owner_id=user.pk, task_id=task.pk) == []
    assert services._endpoints_by_orm(owner_id=user.pk, task_id=task.pk) == []
