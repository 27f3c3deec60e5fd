"""Which events a turn's end produces, for which endpoints, in the same transaction."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import transaction
from django.utils import timezone

from backend.dispatch.claims import claim_turns
from backend.dispatch.leases import reclaim_expired_leases
from backend.tasks.factories import CODEX, answered_task, pending_assistant_turns
from backend.tasks.models import Subtask
from backend.tasks.services import (
    PipelineStep,
    append_message,
    cancel_task,
    cancel_turn,
    create_task,
    record_result,
    send_message,
)
from backend.webhooks.models import WebhookDelivery
from backend.webhooks.services import create_endpoint

pytestmark = pytest.mark.django_db

URL = "https://product.example/hooks"
PIPELINE = [PipelineStep(bot="coder"), PipelineStep(bot="reviewer"), PipelineStep(bot="runner")]


def new_task(owner, pipeline=CODEX):
    return create_task(
        owner=owner, title="T", task_type="code", message="Run the tests.", pipeline=pipeline
    )


def events(**filters) -> list[tuple[str, int]]:
    return sorted(WebhookDelivery.objects.filter(**filters).values_list("event_type", "subtask_id"))


def test_completion_is_announced_once_with_a_small_payload(user):
    endpoint = create_endpoint(owner=user, url=URL)
    task = new_task(user)
    [turn] = pending_assistant_turns(task=task)
    record_result(subtask=turn, status="COMPLETED", result={"value": "secret answer " * 100})
    [delivery] = WebhookDelivery.objects.all()
    assert (delivery.endpoint_id, delivery.event_type, delivery.status) == (
        endpoint.pk,
        "turn.completed",
        "pending",
    )
    payload = delivery.payload
    assert payload["id"] == delivery.event_id == f"evt_{turn.pk}_completed"
    assert payload["type"] == "turn.completed"
    assert (payload["task_id"], payload["subtask_id"], payload["message_id"]) == (
        task.pk,
        turn.pk,
        turn.message_id,
    )
    assert (payload["status"], payload["error_code"], payload["bot"]) == ("COMPLETED", "", "codex")
    assert payload["links"] == {
        "task": f"/api/tasks/{task.pk}/",
        "turn": f"/api/tasks/{task.pk}/subtasks/?after={turn.message_id - 1}&page_size=1",
    }
    assert "secret answer" not in str(payload)
    assert "Run the tests" not in str(payload)


def test_a_failed_step_announces_the_later_steps_failed_with_it(user, pipeline_bots):
    create_endpoint(owner=user, url=URL)
    task = new_task(user, PIPELINE)
    first, second, third = pending_assistant_turns(task=task)
    record_result(subtask=first, status="COMPLETED", result={"value": "ok"})
    record_result(subtask=second, status="FAILED", error="boom", error_code="upstream_error")
    assert events() == [
        ("turn.completed", first.pk),
        ("turn.failed", second.pk),
        ("turn.failed", third.pk),
    ]
    assert WebhookDelivery.objects.get(subtask_id=second.pk).payload["error_code"] == (
        "upstream_error"
    )


def test_cancelling_one_turn_announces_it_and_the_steps_after_it(user, pipeline_bots):
    create_endpoint(owner=user, url=URL)
    task = new_task(user, PIPELINE)
    first, second, third = pending_assistant_turns(task=task)
    record_result(subtask=first, status="COMPLETED", result={"value": "ok"})
    cancel_turn(task=task, subtask_id=second.pk)
    assert events(event_type="turn.cancelled") == [
        ("turn.cancelled", second.pk),
        ("turn.cancelled", third.pk),
    ]


def test_cancelling_the_task_announces_each_open_turn_once(user, pipeline_bots):
    create_endpoint(owner=user, url=URL)
    task = new_task(user, PIPELINE)
    first, second, third = pending_assistant_turns(task=task)
    cancel_turn(task=task, subtask_id=third.pk)
    cancel_task(task=task)
    cancel_task(task=task)  # a no-op
    assert events() == [
        ("turn.cancelled", first.pk),
        ("turn.cancelled", second.pk),
        ("turn.cancelled", third.pk),
    ]


def test_a_turn_failed_by_its_expired_lease_is_announced(user, worker, settings):
    settings.BATON_MAX_ATTEMPTS = 1
    create_endpoint(owner=user, url=URL)
    task = new_task(user)
    [claimed] = claim_turns(worker=worker, worker_id="w1", kinds=["codex"], limit=1)
    turn = Subtask.objects.get(pk=claimed.subtask.pk)
    assert turn.status == "RUNNING"
    assert not WebhookDelivery.objects.exists()
    summary = reclaim_expired_leases(now=turn.lease_expires_at + timedelta(seconds=1))
    assert summary.failed == 1
    [delivery] = WebhookDelivery.objects.all()
    assert (delivery.event_type, delivery.subtask_id, delivery.payload["error_code"]) == (
        "turn.failed",
        turn.pk,
        "lease_expired",
    )
    assert delivery.task_id == task.pk


def test_a_requeued_turn_is_not_announced(user, worker):
    create_endpoint(owner=user, url=URL)
    new_task(user)
    [claimed] = claim_turns(worker=worker, worker_id="w1", kinds=["codex"], limit=1)
    expiry = Subtask.objects.get(pk=claimed.subtask.pk).lease_expires_at
    assert reclaim_expired_leases(now=expiry + timedelta(seconds=1)).requeued == 1
    assert not WebhookDelivery.objects.exists()


def test_a_rolled_back_change_leaves_no_delivery(user):
    create_endpoint(owner=user, url=URL)
    task = new_task(user)
    [turn] = pending_assistant_turns(task=task)
    with pytest.raises(RuntimeError), transaction.atomic():
        record_result(subtask=turn, status="COMPLETED", result={"value": "ok"})
        assert WebhookDelivery.objects.count() == 1
        raise RuntimeError("the caller's transaction fails after the turn was recorded")
    assert not WebhookDelivery.objects.exists()
    assert Subtask.objects.get(pk=turn.pk).status == "PENDING"


def test_other_users_endpoints_never_hear_events(user, other_user):
    create_endpoint(owner=other_user, url=URL)
    answered_task(owner=user)
    assert not WebhookDelivery.objects.exists()


def test_task_scoped_and_account_wide_endpoints(user):
    task = new_task(user)
    other = new_task(user)
    everywhere = create_endpoint(owner=user, url=URL)
    scoped = create_endpoint(owner=user, url=URL, task_id=task.pk)
    only_failures = create_endpoint(owner=user, url=URL, events=["turn.failed"])
    inactive = create_endpoint(owner=user, url=URL)
    inactive.active = False
    inactive.save()
    for each in (task, other):
        [turn] = pending_assistant_turns(task=each)
        record_result(subtask=turn, status="COMPLETED", result={"value": "ok"})
    assert sorted(WebhookDelivery.objects.values_list("endpoint_id", "task_id")) == sorted(
        [(everywhere.pk, task.pk), (everywhere.pk, other.pk), (scoped.pk, task.pk)]
    )
    assert not WebhookDelivery.objects.filter(endpoint=only_failures).exists()


def test_user_turns_are_not_announced(user):
    create_endpoint(owner=user, url=URL)
    task = answered_task(owner=user)
    append_message(task=task, message="Again.")
    assert events() == [("turn.completed", task.subtasks.get(message_id=2).pk)]


def test_one_query_for_an_owner_without_endpoints(user, django_assert_num_queries):
    from backend.tasks.turn_events import announce_ended_turns

    task = new_task(user)
    [turn] = pending_assistant_turns(task=task)
    turn.status = "COMPLETED"
    with django_assert_num_queries(1):
        announce_ended_turns(task=task, turns=[turn], occurred_at=timezone.now())


@pytest.mark.parametrize("turns", [1, 3])
def test_delivery_creation_takes_constant_queries(
    user, pipeline_bots, django_assert_num_queries, turns
):
    from backend.tasks.turn_events import announce_ended_turns

    create_endpoint(owner=user, url=URL)
    create_endpoint(owner=user, url=URL + "/2")
    task = new_task(user, PIPELINE[:turns])
    now = timezone.now()
    Subtask.objects.filter(task=task, role="ASSISTANT").update(status="CANCELLED", finished_at=now)
    # The endpoints, the cancelled turns, the insert.
    with django_assert_num_queries(3):
        announce_ended_turns(
            task=task,
            turns=task.subtasks.filter(role="ASSISTANT", status="CANCELLED", finished_at=now),
            occurred_at=now,
        )
    assert WebhookDelivery.objects.count() == 2 * turns


def test_the_same_event_twice_is_delivered_once(user):
    from backend.tasks.turn_events import announce_ended_turns

    create_endpoint(owner=user, url=URL)
    task = answered_task(owner=user)
    turn = task.subtasks.get(message_id=2)
    announce_ended_turns(task=task, turns=[turn], occurred_at=timezone.now())
    assert WebhookDelivery.objects.count() == 1


@pytest.mark.usefixtures("pipeline_bots")
def test_worker_reports_through_the_api_are_announced(api, worker_api, settings):
    """The executor API's path (a report under the locks the claim took), end to end."""
    from tests.dispatch.test_dispatch_api import create, dispatch, report

    settings.BATON_MAX_ATTEMPTS = 1
    assert api.post("/api/webhooks/", {"url": URL}, format="json").status_code == 201
    completed = create(api)
    [turn] = dispatch(worker_api)
    assert report(worker_api, turn, result={"value": "done"}).status_code == 200
    # A repeated report changes nothing and announces nothing again.
    assert report(worker_api, turn, result={"value": "done"}).json()["changed"] is False
    create(api)
    [retried] = dispatch(worker_api)
    response = report(
        worker_api, retried, status="RETRY", error="HTTP 500", error_code="upstream_error"
    )
    assert response.json()["status"] == "FAILED"  # the last attempt
    assert events() == [
        ("turn.completed", turn["subtask_id"]),
        ("turn.failed", retried["subtask_id"]),
    ]
    assert WebhookDelivery.objects.get(event_type="turn.completed").task_id == completed["id"]


@pytest.mark.parametrize(
    ("strategy", "status", "error_code"),
    [("interrupt", "INTERRUPTED", "interrupted"), ("rollback", "CANCELLED", "rolled_back")],
)
def test_a_turn_a_follow_up_stops_is_announced_as_cancelled(
    user, worker, strategy, status, error_code
):
    create_endpoint(owner=user, url=URL)
    task = new_task(user)
    [claimed] = claim_turns(worker=worker, worker_id="w", kinds=["codex"], limit=1)
    send_message(task=task, message="Do this instead.", strategy=strategy)
    [delivery] = WebhookDelivery.objects.all()
    assert (delivery.event_type, delivery.subtask_id) == ("turn.cancelled", claimed.subtask.pk)
    assert (delivery.payload["status"], delivery.payload["error_code"]) == (status, error_code)


def test_links_start_with_the_public_url_when_one_is_set(user, settings):
    settings.BATON_PUBLIC_URL = "https://baton.example.com/agents"
    create_endpoint(owner=user, url=URL)
    task = answered_task(owner=user)
    [delivery] = WebhookDelivery.objects.all()
    assert delivery.payload["links"]["task"] == (
        f"https://baton.example.com/agents/api/tasks/{task.pk}/"
    )
    assert delivery.payload["links"]["turn"].startswith(
        f"https://baton.example.com/agents/api/tasks/{task.pk}/subtasks/?after="
    )
