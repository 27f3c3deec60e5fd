"""Long polling over HTTP: an idle worker's dispatch waits for a turn (`dispatch.waiting`).

The waiting tests run real concurrent requests (one thread each, its own connection) on a
transactional database, on SQLite and on PostgreSQL (DATABASE_URL=postgres://...). Times
are only ever checked as "it waited at least the wait"; latency is measured by
bench/streams.py (polling).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from datetime import timedelta

import pytest
from django.contrib.auth import get_user_model
from django.db import connection, transaction
from django.utils import timezone
from rest_framework.test import APIClient

from backend.dispatch.leases import reclaim_expired_leases
from backend.dispatch.waiting import LISTENER, claim_or_wait
from backend.tasks.models import Subtask
from backend.tasks.services import PipelineStep, create_task
from backend.tasks.wakeups import BELL, PENDING_CHANNEL, announce_pending
from tests.conftest import make_worker, pooled_connections_held, token_client

DISPATCH = "/api/executor/dispatch/"
# Long enough for a loaded machine to start every request before the turn is created.
SETTLE_SECONDS = 0.5


def dispatch(client: APIClient, *, worker_id: str, wait_seconds: object, kinds=("codex",)):
    return client.post(
        DISPATCH,
        {"kinds": list(kinds), "limit": 1, "worker_id": worker_id, "wait_seconds": wait_seconds},
        format="json",
    )


@pytest.fixture(autouse=True)
def listener_stopped_after_each_test() -> Iterator[None]:
    """The listener's own connection would keep PostgreSQL from dropping the test database."""
    yield
    LISTENER.stop()


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("wait_seconds", "error"),
    [
        ("1", "Must be a number."),
        (True, "Must be a number."),
        ([1], "Must be a number."),
        (-0.5, "greater than or equal to 0"),
        (30.5, "at most 30 seconds"),
    ],
)
def test_wait_seconds_must_be_a_number_within_the_limit(worker_api, wait_seconds, error):
    response = dispatch(worker_api, worker_id="w1", wait_seconds=wait_seconds)
    assert response.status_code == 400
    assert error in str(response.json()), response.json()
    assert "wait_seconds" in str(response.json())


@pytest.mark.django_db
def test_the_limit_is_the_setting(worker_api, settings):
    settings.BATON_DISPATCH_MAX_WAIT_SECONDS = 2
    assert dispatch(worker_api, worker_id="w1", wait_seconds=2.5).status_code == 400
    assert dispatch(worker_api, worker_id="w1", wait_seconds=0).status_code == 200


@pytest.mark.django_db(transaction=True)
def test_with_nothing_pending_the_dispatch_waits_then_answers_empty(worker_api):
    started = time.monotonic()
    response = dispatch(worker_api, worker_id="w1", wait_seconds=0.3)
    waited = time.monotonic() - started
    assert response.status_code == 200
    assert response.json() == {"turns": [], "next_ready_in_seconds": None}
    assert waited >= 0.3


def _waiting_dispatches(
    count: int, *, wait_seconds: float
) -> tuple[list[threading.Thread], list[dict], Callable[[], None]]:
    """`count` workers (accounts of their own) dispatching with `wait_seconds`, each in a
    thread; their answers land in the returned list; call the function to join them."""
    clients = [token_client(make_worker(f"waiter-{index}")) for index in range(count)]
    answers: list[dict] = [{} for _ in range(count)]

    def wait(index: int) -> None:
        try:
            response = dispatch(clients[index], worker_id=f"w{index}", wait_seconds=wait_seconds)
            answers[index] = {"status": response.status_code, **response.json()}
        finally:
            connection.close()

    threads = [threading.Thread(target=wait, args=(index,)) for index in range(count)]
    for thread in threads:
        thread.start()

    def join() -> None:
        for thread in threads:
            thread.join(timeout=wait_seconds + 60)

    return threads, answers, join


@pytest.mark.postgres_only
@pytest.mark.django_db(transaction=True)
def test_waiting_dispatches_hold_no_pooled_connection():
    """A waiter hands its connection back to the process's pool while it waits at the bell,
    so idle workers do not use up the pool: only the threads that query hold one."""
    waiters = 6
    threads, answers, join = _waiting_dispatches(waiters, wait_seconds=5)
    connection.close()  # this thread's, back to the pool
    deadline = time.monotonic() + 4
    held = pooled_connections_held()
    while held > 0 or len(BELL._doorbells) < waiters:
        assert time.monotonic() < deadline, f"{held} waiting dispatches hold a connection"
        time.sleep(0.02)
        held = pooled_connections_held()
    assert all(thread.is_alive() for thread in threads)  # still waiting
    join()
    assert answers == [{"status": 200, "turns": [], "next_ready_in_seconds": None}] * waiters


def _new_task(number: int = 0) -> Subtask:
    owner = get_user_model().objects.get_or_create(username="owner")[0]
    task = create_task(
        owner=owner,
        title=f"t{number}",
        task_type="code",
        message="CI is red.",
        pipeline=[PipelineStep(executor="codex")],
    )
    return Subtask.objects.get(task=task, role="ASSISTANT")


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("shipped_bots")
def test_a_turn_created_while_two_workers_wait_reaches_exactly_one_of_them():
    wait_seconds = 5.0
    _, answers, join = _waiting_dispatches(2, wait_seconds=wait_seconds)
    time.sleep(SETTLE_SECONDS)
    turn = _new_task()
    join()
    assert [answer["status"] for answer in answers] == [200, 200]
    delivered = [t["subtask_id"] for answer in answers for t in answer["turns"]]
    assert delivered == [turn.pk]  # one waiter got it, the other none
    turn.refresh_from_db()
    assert turn.status == "RUNNING"
    winner = next(index for index, answer in enumerate(answers) if answer["turns"])
    assert turn.lease_owner == f"w{winner}"


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("shipped_bots")
def test_a_waiter_gets_a_turn_whose_backoff_ends_during_the_wait():
    """The announcement comes before the turn is claimable: the waiter looks again when the
    backoff ends (its clock, or the poll), not only when it is woken."""
    _, answers, join = _waiting_dispatches(1, wait_seconds=5.0)
    time.sleep(SETTLE_SECONDS)
    with transaction.atomic():
        turn = _new_task()
        Subtask.objects.filter(pk=turn.pk).update(
            not_before=timezone.now() + timedelta(seconds=0.5)
        )
    join()
    assert [t["subtask_id"] for t in answers[0]["turns"]] == [turn.pk]


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("shipped_bots")
def test_waiting_workers_of_another_kind_get_nothing():
    _, answers, join = _waiting_dispatches(1, wait_seconds=1.0)
    # The waiter serves codex; this worker serves claude_code and waits for its kind only.
    other = token_client(make_worker("claude-worker"))
    time.sleep(SETTLE_SECONDS)
    turn = _new_task()
    response = dispatch(other, worker_id="c1", wait_seconds=0.2, kinds=("claude_code",))
    join()
    assert response.json()["turns"] == []
    assert [t["subtask_id"] for t in answers[0]["turns"]] == [turn.pk]


@pytest.mark.django_db(transaction=True)
def test_a_waiter_whose_client_hung_up_stops_and_hands_on_the_wake_up_it_took():
    """Over real HTTP: test_long_polling_hang_up.py. Here the hand-on: the waiter that went
    was the longest waiting, so an announcement woke it and not the next waiter; it must not
    take that wake-up with it (on PostgreSQL the next waiter would sleep on, with a turn
    there)."""
    worker = make_worker("gone")
    gone = threading.Event()
    answers: list[list] = []

    def wait() -> None:
        try:
            answers.append(
                claim_or_wait(
                    worker=worker,
                    worker_id="gone",
                    kinds=["codex"],
                    limit=1,
                    wait_seconds=20,
                    still_connected=lambda: not gone.is_set(),
                )
            )
        finally:
            connection.close()

    thread = threading.Thread(target=wait)
    thread.start()
    time.sleep(SETTLE_SECONDS)
    with BELL.doorbell(["codex"]) as next_waiter:
        stopping = time.monotonic()
        gone.set()
        BELL.ring(["codex"])  # wakes the waiter that went, unless it has left already
        assert next_waiter.wait(30)
    thread.join(timeout=60)
    assert answers == [[]]
    assert time.monotonic() - stopping < 10  # not the 20 s wait


def _claim(kinds=("codex",)) -> Callable[[str], Subtask]:
    """A worker of its own claims a pending turn over HTTP; call the result to report its
    outcome (`status`)."""
    client = token_client(make_worker("runner"))
    body = {"kinds": list(kinds), "limit": 1, "worker_id": "runner"}
    [turn] = client.post(DISPATCH, body, format="json").json()["turns"]

    def report(status: str) -> Subtask:
        report = {"worker_id": "runner", "attempt": turn["attempt"], "status": status}
        if status == "COMPLETED":
            report["result"] = {"value": "Done."}
        if status == "RETRY":
            report.update(error="HTTP 503 from the model", error_code="upstream_error")
        path = f"/api/executor/subtasks/{turn['subtask_id']}/result/"
        assert client.post(path, report, format="json").status_code == 200
        return Subtask.objects.get(pk=turn["subtask_id"])

    return report


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("shipped_bots")
def test_the_next_pipeline_step_reaches_a_waiter_of_its_kind():
    owner = get_user_model().objects.create_user(username="owner")
    task = create_task(
        owner=owner,
        title="two steps",
        task_type="code",
        message="Fix it, then review.",
        pipeline=[PipelineStep(executor="codex"), PipelineStep(executor="claude_code")],
    )
    body = {"kinds": ["claude_code"], "limit": 1, "worker_id": "reviewer", "wait_seconds": 10}
    reviewer = token_client(make_worker("reviewer"))
    answer: dict = {}

    def wait() -> None:
        try:
            answer.update(reviewer.post(DISPATCH, body, format="json").json())
        finally:
            connection.close()

    report = _claim()
    thread = threading.Thread(target=wait)
    thread.start()
    time.sleep(SETTLE_SECONDS)
    report("COMPLETED")
    thread.join(timeout=60)
    second = Subtask.objects.get(task=task, pipeline_step=1)
    assert [t["subtask_id"] for t in answer["turns"]] == [second.pk]


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("shipped_bots")
def test_a_released_turn_reaches_a_waiting_worker():
    turn = _new_task()
    report = _claim()
    _, answers, join = _waiting_dispatches(1, wait_seconds=10.0)
    time.sleep(SETTLE_SECONDS)
    released = report("RELEASE")
    join()
    assert released.pk == turn.pk
    assert [t["subtask_id"] for t in answers[0]["turns"]] == [turn.pk]


@pytest.fixture
def bell_rung_by_commits(transactional_db):
    """A doorbell of these kinds at this process's bell, rung by committed announcements:
    directly on SQLite, through NOTIFY and the listener on PostgreSQL (listening on the test
    database, hence after it is set up)."""
    if connection.vendor == "postgresql":
        assert LISTENER.start()
    return BELL.doorbell


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("shipped_bots")
def test_every_way_a_turn_becomes_pending_is_announced(bell_rung_by_commits):
    with bell_rung_by_commits(["codex"]) as new_task:
        turn = _new_task()
        assert new_task.wait(30)
    report = _claim()
    with bell_rung_by_commits(["codex"]) as released:
        report("RELEASE")
        assert released.wait(30)
    report = _claim()
    with bell_rung_by_commits(["codex"]) as retried:
        report("RETRY")  # requeued after a backoff
        assert retried.wait(30)
    Subtask.objects.filter(pk=turn.pk).update(not_before=None)
    _claim()
    Subtask.objects.filter(pk=turn.pk).update(lease_expires_at=timezone.now() - timedelta(1))
    with bell_rung_by_commits(["codex"]) as reclaimed:
        assert reclaim_expired_leases().requeued == 1
        assert reclaimed.wait(30)


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("shipped_bots")
def test_the_next_pipeline_step_is_announced_to_its_kind(bell_rung_by_commits):
    owner = get_user_model().objects.create_user(username="owner")
    create_task(
        owner=owner,
        title="two steps",
        task_type="code",
        message="Fix it, then review.",
        pipeline=[PipelineStep(executor="codex"), PipelineStep(executor="claude_code")],
    )
    report = _claim()
    with bell_rung_by_commits(["claude_code"]) as next_step:
        report("COMPLETED")
        assert next_step.wait(30)


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("shipped_bots")
def test_a_write_that_rolls_back_announces_nothing(bell_rung_by_commits):
    with bell_rung_by_commits(["codex"]) as doorbell:
        with pytest.raises(RuntimeError), transaction.atomic():
            _new_task()
            raise RuntimeError("rolled back")
        # Something else commits and is announced after it, so the bell would have rung by now.
        with bell_rung_by_commits(["agno"]) as later:
            announce_pending(executors=["agno"])
            # Waited for at the bell: a ring after the waiter left would find nobody.
            assert later.wait(30)
        assert not doorbell.rung.is_set()


@pytest.mark.postgres_only
@pytest.mark.django_db(transaction=True)
def test_the_listener_rings_the_bell_on_a_notify_from_another_connection():
    """The NOTIFY path alone: a notification sent on some other connection (as another server
    process would) wakes this process's waiters of that kind."""
    assert LISTENER.start()
    with BELL.doorbell(["codex"]) as other_kind, BELL.doorbell(["agno"]) as doorbell:
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_notify(%s, %s)", [PENDING_CHANNEL, "agno"])
        assert doorbell.wait(30)
        assert not other_kind.rung.is_set()


def test_an_announcement_wakes_one_waiter_of_its_kind_the_longest_waiting():
    with (
        BELL.doorbell(["codex"]) as first,
        BELL.doorbell(["agno"]) as other_kind,
        BELL.doorbell(["codex", "agno"]) as second,
    ):
        BELL.ring(["codex"])
        assert (first.rung.is_set(), other_kind.rung.is_set(), second.rung.is_set()) == (
            True,
            False,
            False,
        )
        BELL.ring(["codex"])  # the first is busy looking: the next one wakes
        assert second.rung.is_set()
        BELL.ring_all()
        assert other_kind.rung.is_set()
