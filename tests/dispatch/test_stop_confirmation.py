"""A cancel that waits: workers confirm that a stopped turn's executor is gone, and a product's
cancel with ?wait=true answers 200 once every stopped turn is confirmed, 202 when its timeout
passes first. (End to end, with the real executors: test_executors' cancel during a tool call.)
"""

from __future__ import annotations

import threading
import time

import pytest
from django.db import connection

from backend.dispatch.reports import confirm_stopped
from backend.dispatch.stops import stops_unconfirmed
from backend.tasks.models import Subtask
from tests.dispatch.test_dispatch_api import PIPELINE, create, dispatch, report

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("pipeline_bots")]


def stopped(worker_api, turn, *, worker_id="w1", attempt=None):
    return worker_api.post(
        f"/api/executor/subtasks/{turn['subtask_id']}/stopped/",
        {"worker_id": worker_id, "attempt": attempt or turn["attempt"]},
        format="json",
    )


def cancel_turn(api, task, subtask_id, **params):
    query = "&".join(f"{key}={value}" for key, value in params.items())
    return api.post(f"/api/tasks/{task['id']}/subtasks/{subtask_id}/cancel/?{query}")


def confirmed_at(subtask_id):
    return Subtask.objects.get(pk=subtask_id).stop_confirmed_at


def test_a_running_turn_waits_for_its_workers_confirmation_a_pending_one_does_not(api, worker_api):
    task = create(api, PIPELINE)
    [coder] = dispatch(worker_api, kinds=["codex", "claude_code"])
    response = cancel_turn(api, task, coder["subtask_id"])
    assert response.status_code == 200
    (running, later_step) = response.json()
    assert running["status"] == later_step["status"] == "CANCELLED"
    assert running["stop_confirmed_at"] is None  # its executor may still be running
    assert later_step["stop_confirmed_at"] is not None  # it never ran
    assert stops_unconfirmed(task_id=task["id"])

    answer = stopped(worker_api, coder)
    assert answer.status_code == 200, answer.json()
    first = confirmed_at(coder["subtask_id"])
    assert first is not None
    assert stopped(worker_api, coder).status_code == 200  # a repeat changes nothing
    assert confirmed_at(coder["subtask_id"]) == first
    assert not stops_unconfirmed(task_id=task["id"])
    # The stopped claim's result stays refused.
    late = report(worker_api, coder, result={"value": "late"})
    assert (late.status_code, late.json()["code"]) == (409, "cancelled")


def test_only_the_stopped_turns_last_claim_confirms_and_only_a_stop(
    api, worker_api, other_worker_api
):
    task = create(api)
    [turn] = dispatch(worker_api)
    running = stopped(worker_api, turn)
    assert (running.status_code, running.json()["code"]) == (409, "conflict")
    cancel_turn(api, task, turn["subtask_id"])
    assert stopped(other_worker_api, turn).status_code == 404  # never its claim
    wrong = stopped(worker_api, turn, worker_id="w2")
    assert (wrong.status_code, wrong.json()["code"]) == (409, "lease_lost")
    assert confirmed_at(turn["subtask_id"]) is None


def test_a_cancel_that_waits_in_vain_answers_202_when_its_timeout_passes(api, worker_api):
    task = create(api)
    [turn] = dispatch(worker_api)
    response = cancel_turn(api, task, turn["subtask_id"], wait="true", timeout="0.2")
    assert response.status_code == 202
    assert response.json()[0]["status"] == "CANCELLED"
    assert response.json()[0]["stop_confirmed_at"] is None


def test_a_cancel_that_waits_for_a_turn_that_never_ran_answers_at_once(api):
    task = create(api)
    response = cancel_turn(api, task, task["turns"][1]["id"], wait="true", timeout="60")
    assert response.status_code == 200
    whole = api.post(f"/api/tasks/{task['id']}/cancel/?wait=true&timeout=60")
    assert whole.status_code == 200


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("shipped_bots")
@pytest.mark.parametrize("scope", ["turn", "task"])
def test_a_cancel_that_waits_answers_200_once_the_worker_confirms(scope, api, worker, worker_api):
    task = create(api)
    [turn] = dispatch(worker_api)

    def worker_confirms() -> None:
        try:
            while not Subtask.objects.filter(pk=turn["subtask_id"], status="CANCELLED").exists():
                time.sleep(0.02)
            time.sleep(0.2)  # the executor takes a moment to go
            confirm_stopped(worker=worker, worker_id="w1", attempt=1, subtask_id=turn["subtask_id"])
        finally:
            connection.close()

    confirming = threading.Thread(target=worker_confirms)
    confirming.start()
    if scope == "turn":
        response = cancel_turn(api, task, turn["subtask_id"], wait="true", timeout="30")
    else:
        response = api.post(f"/api/tasks/{task['id']}/cancel/?wait=true&timeout=30")
    confirming.join(timeout=30)
    assert response.status_code == 200, response.json()
    assert confirmed_at(turn["subtask_id"]) is not None


def test_an_interrupted_turn_waits_for_its_confirmation_too(api, worker_api):
    task = create(api)
    [turn] = dispatch(worker_api)
    api.post(
        f"/api/tasks/{task['id']}/messages/",
        {"message": "now this", "strategy": "interrupt"},
        format="json",
    )
    assert confirmed_at(turn["subtask_id"]) is None
    assert stopped(worker_api, turn).status_code == 200
    assert confirmed_at(turn["subtask_id"]) is not None


@pytest.mark.parametrize(
    ("query", "field"),
    [("wait=true&timeout=61", "timeout"), ("wait=maybe", "wait"), ("linger=1", "linger")],
)
def test_a_bad_cancel_query_is_a_400_naming_the_field_and_cancels_nothing(api, query, field):
    task = create(api)
    response = api.post(
        f"/api/tasks/{task['id']}/subtasks/{task['turns'][1]['id']}/cancel/?{query}"
    )
    assert response.status_code == 400
    assert field in response.json()["fields"]
    assert api.post(f"/api/tasks/{task['id']}/cancel/?{query}").status_code == 400
    assert Subtask.objects.get(pk=task["turns"][1]["id"]).status == "PENDING"
