"""A claim that no longer holds its turn gets one answer over HTTP, whatever the path: 409
`lease_lost` with the reason in `detail`; and a lease whose time has passed stays lost."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from backend.tasks.models import Subtask
from tests.conftest import make_worker, token_client
from tests.dispatch.test_dispatch_api import create, dispatch, report
from tests.dispatch.test_outcomes import heartbeat

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("pipeline_bots")]


def expire(turn: dict) -> None:
    """The lease's time has passed (as if the worker had been silent for the whole lease)."""
    Subtask.objects.filter(pk=turn["subtask_id"]).update(
        lease_expires_at=timezone.now() - timedelta(seconds=1)
    )


def run_reclaim(client) -> None:
    """A dispatch call reclaims expired leases first; this one asks for a kind nobody sent."""
    assert dispatch(client, kinds=["agno"]) == []


def claim_calls(client, turn, *, worker_id="w1") -> dict[str, object]:
    """The turn's heartbeat, progress, result and result value upload, from the claim `turn`
    names."""
    url = f"/api/executor/subtasks/{turn['subtask_id']}"
    claim = {"worker_id": worker_id, "attempt": turn["attempt"]}
    calls = {
        path: client.post(f"{url}/{path}/", body, format="json")
        for path, body in [
            ("heartbeat", claim),
            ("progress", {**claim, "events": [], "partial_text": "late"}),
            ("result", {**claim, "status": "COMPLETED", "result": {"value": "late"}}),
        ]
    }
    calls["result/value"] = client.put(
        f"{url}/result/value/?worker_id={worker_id}&attempt={turn['attempt']}",
        b"late",
        content_type="text/plain; charset=utf-8",
    )
    return calls


def assert_lease_lost(answers: dict[str, object], reason: str) -> None:
    for path, answer in answers.items():
        assert (answer.status_code, answer.json()["code"]) == (409, "lease_lost"), path
        assert reason in answer.json()["detail"], (path, answer.json()["detail"])


def test_a_claim_taken_over_by_another_account_is_told_its_lease_is_lost(
    api, worker_api, other_worker_api
):
    create(api)
    [turn] = dispatch(worker_api)
    expire(turn)
    [again] = dispatch(other_worker_api, worker_id="w2")  # reclaims, then claims anew
    assert (again["subtask_id"], again["attempt"]) == (turn["subtask_id"], 2)
    answers = claim_calls(worker_api, turn)
    assert_lease_lost(answers, "attempt 2 of another worker account holds the turn now")
    assert "w2" not in answers["result"].json()["detail"]  # the other account's names stay its own
    assert heartbeat(worker_api, [turn]) == {turn["subtask_id"]: "lease_lost"}
    stored = Subtask.objects.get(pk=turn["subtask_id"])
    assert (stored.status, stored.lease_owner, stored.partial_text, stored.result) == (
        "RUNNING",
        "w2",
        "",
        None,
    )
    # The new holder goes on as usual.
    assert (
        report(other_worker_api, again, worker_id="w2", result={"value": "ok"}).status_code == 200
    )
    assert_lease_lost(claim_calls(worker_api, turn), "the turn is COMPLETED; attempt 2")


def test_an_account_that_never_held_the_turn_learns_nothing(api, worker_api, other_worker_api):
    create(api)
    [turn] = dispatch(worker_api)
    expire(turn)
    dispatch(other_worker_api, worker_id="w2")
    stranger = token_client(make_worker("worker-3"))
    for path, answer in claim_calls(stranger, turn).items():
        assert answer.status_code == 404, path
    # Naming the first claim does not help an account that did not make it.
    for path, answer in claim_calls(stranger, turn, worker_id="w1").items():
        assert answer.status_code == 404, path
    assert heartbeat(stranger, [turn]) == {turn["subtask_id"]: "lease_lost"}


def test_a_late_report_after_a_requeue_that_nobody_claimed_yet(api, worker_api):
    create(api)
    [turn] = dispatch(worker_api)
    expire(turn)
    run_reclaim(worker_api)
    answers = claim_calls(worker_api, turn)
    assert_lease_lost(
        answers, "the lease expired; Baton requeued the turn and no claim holds it yet"
    )
    stored = Subtask.objects.get(pk=turn["subtask_id"])
    assert (stored.status, stored.attempts, stored.error_code, stored.result) == (
        "PENDING",
        1,
        "lease_expired",
        None,
    )
    assert stored.lease_expires_at is None  # the heartbeat revived nothing
    [again] = dispatch(worker_api, worker_id="w2")
    assert again["attempt"] == 2


def test_a_late_report_after_baton_failed_the_turn_for_lease_expiry(api, worker_api, settings):
    settings.BATON_MAX_ATTEMPTS = 1
    task = create(api)
    [turn] = dispatch(worker_api)
    expire(turn)
    run_reclaim(worker_api)
    stored = Subtask.objects.get(pk=turn["subtask_id"])
    assert (stored.status, stored.error_code) == ("FAILED", "lease_expired")
    # The claim never recorded this result: not "a different result recorded", its lease is lost.
    answers = claim_calls(worker_api, turn)
    assert_lease_lost(answers, "the lease expired; Baton failed the turn")
    repeated = report(worker_api, turn, result={"value": "late"})
    assert (repeated.status_code, repeated.json()["code"]) == (409, "lease_lost")
    assert heartbeat(worker_api, [turn]) == {turn["subtask_id"]: "lease_lost"}
    shown = api.get(f"/api/tasks/{task['id']}/").json()
    assert shown["status"] == "FAILED"
    assert Subtask.objects.get(pk=turn["subtask_id"]).result is None


def test_a_heartbeat_after_the_lease_time_does_not_revive_the_lease(api, worker_api):
    create(api)
    [turn] = dispatch(worker_api)
    expire(turn)
    answer = worker_api.post(
        f"/api/executor/subtasks/{turn['subtask_id']}/heartbeat/",
        {"worker_id": "w1", "attempt": 1},
        format="json",
    )
    assert (answer.status_code, answer.json()["code"]) == (409, "lease_lost")
    assert "the lease expired; Baton requeued the turn" in answer.json()["detail"]
    # Lost for good: reclaimed at once, so the next claim is a new attempt.
    stored = Subtask.objects.get(pk=turn["subtask_id"])
    assert (stored.status, stored.lease_expires_at, stored.error_code) == (
        "PENDING",
        None,
        "lease_expired",
    )
    [again] = dispatch(worker_api, worker_id="w2")
    assert (again["subtask_id"], again["attempt"]) == (turn["subtask_id"], 2)


def test_the_batched_heartbeat_after_the_lease_time_says_lost_and_extends_nothing(api, worker_api):
    create(api)
    create(api)
    late, fine = dispatch(worker_api)
    expire(late)
    assert heartbeat(worker_api, [late, fine]) == {
        late["subtask_id"]: "lease_lost",
        fine["subtask_id"]: "running",
    }
    stored = Subtask.objects.get(pk=late["subtask_id"])
    assert (stored.status, stored.lease_expires_at, stored.error_code) == (
        "PENDING",
        None,
        "lease_expired",
    )
    # Asking again does not bring it back.
    assert heartbeat(worker_api, [late]) == {late["subtask_id"]: "lease_lost"}
    assert Subtask.objects.get(pk=fine["subtask_id"]).status == "RUNNING"


def test_progress_after_the_lease_time_is_refused_and_extends_nothing(api, worker_api):
    create(api)
    [turn] = dispatch(worker_api)
    expire(turn)
    answer = worker_api.post(
        f"/api/executor/subtasks/{turn['subtask_id']}/progress/",
        {"worker_id": "w1", "attempt": 1, "events": [], "partial_text": "late"},
        format="json",
    )
    assert (answer.status_code, answer.json()["code"]) == (409, "lease_lost")
    stored = Subtask.objects.get(pk=turn["subtask_id"])
    assert (stored.status, stored.partial_text, stored.lease_expires_at) == ("PENDING", "", None)


def test_a_result_after_the_lease_time_is_refused_and_the_turn_reclaimed(api, worker_api):
    task = create(api)
    [turn] = dispatch(worker_api)
    expire(turn)
    late = report(worker_api, turn, result={"value": "late"})
    assert (late.status_code, late.json()["code"]) == (409, "lease_lost")
    assert "the lease expired; Baton requeued the turn" in late.json()["detail"]
    stored = Subtask.objects.get(pk=turn["subtask_id"])
    assert (stored.status, stored.result, stored.error_code) == ("PENDING", None, "lease_expired")
    assert api.get(f"/api/tasks/{task['id']}/").json()["status"] == "PENDING"
    again = report(worker_api, turn, result={"value": "late"})
    assert (again.status_code, again.json()["code"]) == (409, "lease_lost")


def test_a_result_after_the_last_lease_time_fails_the_turn(api, worker_api, settings):
    settings.BATON_MAX_ATTEMPTS = 1
    create(api)
    [turn] = dispatch(worker_api)
    expire(turn)
    late = report(worker_api, turn, result={"value": "late"})
    assert (late.status_code, late.json()["code"]) == (409, "lease_lost")
    assert "the lease expired; Baton failed the turn" in late.json()["detail"]
    stored = Subtask.objects.get(pk=turn["subtask_id"])
    assert (stored.status, stored.result, stored.error_code) == ("FAILED", None, "lease_expired")


def test_a_recorded_report_repeated_later_is_still_a_no_op(api, worker_api):
    create(api)
    create(api)
    done, released = dispatch(worker_api)
    body = {"result": {"value": "done"}, "usage": {"input_tokens": 3}}
    assert report(worker_api, done, **body).json()["changed"] is True
    assert report(worker_api, released, status="RELEASE").json()["changed"] is True
    run_reclaim(worker_api)  # later: reclaims ran, the claims' lease time is long gone
    again = report(worker_api, done, **body)
    assert (again.status_code, again.json()["changed"]) == (200, False)
    assert report(worker_api, released, status="RELEASE").json()["changed"] is False
    # A different result from the claim that recorded one is still a plain conflict.
    different = report(worker_api, done, result={"value": "other"})
    assert (different.status_code, different.json()["code"]) == (409, "conflict")
    # After its own result, the claim's heartbeat is answered like any lost lease.
    answer = worker_api.post(
        f"/api/executor/subtasks/{done['subtask_id']}/heartbeat/",
        {"worker_id": "w1", "attempt": 1},
        format="json",
    )
    assert (answer.status_code, answer.json()["code"]) == (409, "lease_lost")
    assert "this claim already reported the turn COMPLETED" in answer.json()["detail"]


def test_lease_expired_is_batons_own_error_code(api, worker_api):
    create(api)
    [turn] = dispatch(worker_api)
    answer = report(worker_api, turn, status="FAILED", error="gone", error_code="lease_expired")
    assert answer.status_code == 400
    assert "error_code" in answer.json()["fields"]
    assert Subtask.objects.get(pk=turn["subtask_id"]).status == "RUNNING"
