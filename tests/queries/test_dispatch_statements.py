"""The dispatch path's statements (`backend/queries/dispatch.sql`) on PostgreSQL: the claim
picks exactly the turns the ORM's query of that dispatch picks (backoff, session affinity,
kinds, order and limit), skips the turns another claim holds locked, and finds a lease run
out; it returns the claimed rows as the ORM reads them. A report's turn and its task are
locked and read as the ORM's locking reads read them, and a native session is read and
written as the ORM reads and writes it."""

from __future__ import annotations

import threading
from datetime import timedelta

import pytest
from django.contrib.auth import get_user_model
from django.db import DatabaseError, connection, connections, transaction
from django.db.models import BooleanField, Case, ExpressionWrapper, F, Q, Value, When
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from backend import queries
from backend.dispatch import claims, leases, sessions
from backend.dispatch.models import ConfigurationVersion, PromptReport
from backend.dispatch.payload import CLAIMED_FIELDS
from backend.dispatch.sessions import native_sessions_for
from backend.prompting import Role
from backend.tasks.models import NativeSession, Subtask, SubtaskStatus, Task
from backend.tasks.services import PipelineStep, create_task, send_message
from tests.conftest import make_worker

pytestmark = [
    pytest.mark.django_db,
    pytest.mark.postgres_only,
    pytest.mark.usefixtures("shipped_bots"),
]

# (executor, seconds since it became pending, backoff ends in seconds or None, session worker)
TURNS = [
    ("codex", 100, None, ""),
    ("codex", 90, 30, ""),  # backing off
    ("codex", 80, -5, ""),  # backoff over
    ("claude_code", 70, None, ""),
    ("codex", 3, None, "w1"),  # held for w1
    ("codex", 2, None, "w2"),  # held for w2
    ("codex", 60, None, "w2"),  # held for w2 once, the affinity is over
    ("agno", 50, None, ""),
    ("claude_code", 1, None, "w1"),
]


@pytest.fixture
def pending_turns(shipped_bots):
    owner = get_user_model().objects.create_user(username="owner")
    now = timezone.now()
    for index, (executor, age, backoff, session_worker) in enumerate(TURNS):
        task = create_task(
            owner=owner,
            title=f"t{index}",
            task_type="code",
            message=f"job {index}",
            pipeline=[PipelineStep(executor=executor)],
        )
        Subtask.objects.filter(task=task, status=SubtaskStatus.PENDING).update(
            pending_since=now - timedelta(seconds=age),
            not_before=None if backoff is None else now + timedelta(seconds=backoff),
            session_worker=session_worker,
        )
        # Sessions: of the turn's bot where a worker holds the turn, of another bot in every
        # other task, and in every other task of the turn's bot on another executor.
        own = Subtask.objects.get(task=task, status=SubtaskStatus.PENDING).bot
        NativeSession.objects.create(
            task=task,
            bot=own if session_worker else "somebody",
            executor=executor,
            session_id=f"session-{index}",
            worker_id=session_worker or "w9",
            seen_through_message_id=1,
        )
        if index % 2:
            NativeSession.objects.create(
                task=task,
                bot=own,
                executor="agno" if executor != "agno" else "codex",
                session_id=f"elsewhere-{index}",
                worker_id="w9",
                seen_through_message_id=1,
            )
    # Two tasks each with a turn pending beside an earlier round's (a state Baton must never
    # reach), first in line: the earlier running, whose task's pending turn waits; and the
    # earlier pending, which is claimed before the later one.
    for title, earlier, ages in [
        ("busy", SubtaskStatus.RUNNING, (0, 400)),
        ("twice", None, (300, 250)),
    ]:
        task = create_task(
            owner=owner,
            title=title,
            task_type="code",
            message="first",
            pipeline=[PipelineStep(executor="codex")],
        )
        first = Subtask.objects.get(task=task, status=SubtaskStatus.PENDING)
        Subtask.objects.filter(pk=first.pk).update(status=SubtaskStatus.COMPLETED)
        send_message(task=task, message="second")
        Subtask.objects.filter(pk=first.pk).update(
            status=earlier or SubtaskStatus.PENDING,
            lease_owner="w9",
            pending_since=now - timedelta(seconds=ages[0]),
        )
        Subtask.objects.filter(task=task, status=SubtaskStatus.PENDING).exclude(pk=first.pk).update(
            pending_since=now - timedelta(seconds=ages[1])
        )


@pytest.mark.usefixtures("pending_turns")
@pytest.mark.parametrize(
    ("kinds", "worker_id", "limit"),
    [
        (["codex"], "w1", 100),
        (["codex"], "w2", 100),
        (["codex", "claude_code"], "w1", 100),
        (["claude_code", "codex", "codex"], "w3", 100),
        (["agno", "claude_code", "codex"], "w2", 3),
        (["codex"], "w1", 1),
    ],
)
def test_the_claim_picks_what_the_query_of_the_dispatch_picks(kinds, worker_id, limit):
    now = timezone.now()
    expected = list(
        claims._candidates(kinds=kinds, worker_id=worker_id, now=now).values_list("id", flat=True)[
            :limit
        ]
    )
    assert expected  # every case claims something
    claimed, sessions, version, expired = claims._claim_in_one_statement(
        kinds=kinds,
        worker_id=worker_id,
        now=now,
        limit=limit,
        claim={
            "status": SubtaskStatus.RUNNING,
            "claimed_by": make_worker("worker-1"),
            "lease_owner": worker_id,
            "lease_expires_at": now + timedelta(minutes=10),
            "started_at": now,
            "updated_at": now,
        },
    )
    # Oldest first, as the payload reads them: the turn as claimed, with its task.
    assert [row.pk for row in claimed] == expected
    for row in claimed:
        stored = Subtask.objects.select_related("task").get(pk=row.pk)
        assert row.status == SubtaskStatus.RUNNING and row.attempts == stored.attempts
        assert (row.lease_owner, row.lease_expires_at) == (worker_id, stored.lease_expires_at)
        # Every column, each converted as the ORM converts it.
        assert _values(row, CLAIMED_FIELDS) == _values(stored, CLAIMED_FIELDS)
        assert _values(row.task) == _values(stored.task)
    # Each with its bot's native session in its task, as the payload would read them: the
    # held turns have one.
    assert set(sessions) == {row.pk for row in claimed if row.session_worker}
    assert {turn: _values(row) for turn, row in sessions.items()} == {
        turn: _values(row) for turn, row in native_sessions_for(claimed).items()
    }
    # With the configuration version, read in the claim's snapshot, and no lease run out.
    assert version == ConfigurationVersion.objects.get().value
    assert expired is False
    running = Subtask.objects.filter(status=SubtaskStatus.RUNNING, lease_owner=worker_id)
    assert sorted(running.values_list("id", flat=True)) == sorted(expected)


def _values(row, names=None) -> dict[str, object]:
    fields = type(row)._meta.concrete_fields
    return {
        field.attname: getattr(row, field.attname)
        for field in fields
        if names is None or field.name in names
    }


def _columns(model, names=None) -> list[str]:
    return [
        field.column
        for field in model._meta.concrete_fields
        if names is None or field.name in names
    ]


def _listed(between: str, until: str) -> list[str]:
    """The columns the claim statement lists after `between`, up to `until`."""
    text = queries.text("claim_turns")
    listed = text[text.index(between) + len(between) : text.index(until)]
    return [column.strip().split(".")[-1] for column in listed.split(",") if column.strip()]


def test_the_claim_returns_the_columns_the_payload_reads_in_the_models_order():
    """The payload reads the claimed rows by position (`payload.claimed_rows`), and the
    sessions by the model's field order: a column added to a model must be added here."""
    assert _listed("RETURNING", "\n)\nSELECT") == _columns(Subtask, CLAIMED_FIELDS)
    # The claimed turn's columns as RETURNING lists them (`claimed.*`: the statement stays
    # short enough for psycopg to keep its parse), then its task's, then its session's.
    selected = _listed("\nSELECT\n", "(SELECT value")
    tasks = len(Task._meta.concrete_fields)
    assert selected[0] == "*"
    assert selected[1 : 1 + tasks] == _columns(Task)
    assert selected[1 + tasks :] == _columns(NativeSession)


@pytest.mark.django_db(transaction=True)
def test_the_claim_skips_a_turn_another_transaction_holds_locked(shipped_bots):
    owner = get_user_model().objects.create_user(username="owner")
    for title in ("first", "second", "third"):
        create_task(
            owner=owner,
            title=title,
            task_type="code",
            message=title,
            pipeline=[PipelineStep(executor="codex")],
        )
    first = Subtask.objects.filter(status=SubtaskStatus.PENDING).order_by("pending_since", "id")[0]
    locked, release = threading.Event(), threading.Event()

    def hold() -> None:
        try:
            with transaction.atomic():
                Subtask.objects.select_for_update().get(pk=first.pk)
                locked.set()
                release.wait(timeout=30)
        finally:
            connections.close_all()

    holder = threading.Thread(target=hold)
    holder.start()
    try:
        assert locked.wait(timeout=30)
        worker = make_worker("worker-1")
        claimed = claims.claim_turns(worker=worker, worker_id="w", kinds=["codex"], limit=5)
        assert [turn.task.title for turn in claimed] == ["second", "third"]
    finally:
        release.set()
        holder.join()
    # Once the lock is gone, the turn it held is claimed as usual.
    [turn] = claims.claim_turns(worker=worker, worker_id="w", kinds=["codex"], limit=5)
    assert turn.subtask.pk == first.pk


def _plans(statement_start: str) -> dict[str, tuple[int, int]]:
    """(generic, custom) plans run by each of this connection's prepared statements starting
    so, by name. A pooled connection keeps what earlier tests prepared on it (the same
    statement with another LIMIT is another statement), so a test compares before and after."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT name, generic_plans, custom_plans FROM pg_prepared_statements "
            "WHERE statement LIKE %s",
            [statement_start + "%"],
        )
        return {name: (generic, custom) for name, generic, custom in cursor.fetchall()}


def test_the_claim_and_its_lease_check_are_planned_once_not_on_every_dispatch(settings):
    """Prepared after a few runs, the claim statement gets one generic plan that reads the
    partial indexes (the dispatch order, the running leases it asks about): the predicates'
    constants are in the text. Against parameters PostgreSQL planned it again on every
    dispatch. The lease check is part of it: no statement of its own."""
    assert settings.DATABASES["default"]["OPTIONS"]["prepare_threshold"] is not None
    # A long history of answered turns, counted by the planner: a plan that cannot read the
    # partial indexes would scan them all.
    owner = get_user_model().objects.create_user(username="owner")
    task = create_task(
        owner=owner,
        title="long",
        task_type="code",
        message="first",
        pipeline=[PipelineStep(executor="codex")],
    )
    Subtask.objects.filter(task=task).update(status=SubtaskStatus.COMPLETED)
    Subtask.objects.bulk_create(
        Subtask(
            task=task,
            message_id=number,
            role="USER" if number % 2 else "ASSISTANT",
            status=SubtaskStatus.COMPLETED,
            executor="codex",
        )
        for number in range(3, 5003)
    )
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE tasks_subtask")
    worker = make_worker("worker-1")
    before = _plans("WITH claimed AS (")
    for _ in range(20):  # nothing pending: each dispatch still runs the claim statement
        with CaptureQueriesContext(connection) as dispatch:
            assert claims.claim_turns(worker=worker, worker_id="w", kinds=["codex"], limit=1) == []
        assert len(dispatch) == 1
    ran = {
        name: (generic - before.get(name, (0, 0))[0], custom - before.get(name, (0, 0))[1])
        for name, (generic, custom) in _plans("WITH claimed AS (").items()
        if (generic, custom) != before.get(name)
    }
    [(generic, custom)] = ran.values()
    assert generic > 0 and custom <= 5, (generic, custom)


def test_a_lease_run_out_is_reclaimed_and_its_turn_claimed_by_the_same_dispatch():
    owner = get_user_model().objects.create_user(username="owner")
    for title in ("first", "second"):
        create_task(
            owner=owner,
            title=title,
            task_type="code",
            message=title,
            pipeline=[PipelineStep(executor="codex")],
        )
    worker = make_worker("worker-1")
    [first] = claims.claim_turns(worker=worker, worker_id="slow", kinds=["codex"], limit=1)
    Subtask.objects.filter(pk=first.subtask.pk).update(
        lease_expires_at=timezone.now() - timedelta(seconds=1)
    )
    # The claim takes the second task's turn and finds the first's lease run out: that turn
    # goes back in line, keeping its place, and the rest of the limit takes it.
    claimed = claims.claim_turns(worker=worker, worker_id="fast", kinds=["codex"], limit=5)
    assert [(turn.task.title, turn.subtask.attempts) for turn in claimed] == [
        ("first", 2),
        ("second", 1),
    ]
    assert PromptReport.objects.filter(subtask_id=first.subtask.pk, attempt=2).count() == 1
    stored = Subtask.objects.get(pk=first.subtask.pk)
    assert (stored.status, stored.lease_owner, stored.attempts) == ("RUNNING", "fast", 2)


def _reports_as_stored(subtask_id: int) -> list[tuple[object, ...]]:
    return list(
        PromptReport.objects.filter(subtask_id=subtask_id)
        .order_by("kind")
        .values_list("kind", "sent", "resume_reason", "included_message_ids")
    )


@pytest.mark.parametrize("resumed", [False, True])
def test_marking_the_prompt_sent_does_what_the_orm_does(resumed):
    owner = get_user_model().objects.create_user(username="owner")
    create_task(
        owner=owner,
        title="t",
        task_type="code",
        message="m",
        pipeline=[PipelineStep(executor="codex")],
    )
    [turn] = claims.claim_turns(
        worker=make_worker("worker-1"), worker_id="w", kinds=["codex"], limit=1
    )
    subtask = turn.subtask
    resume = PromptReport.objects.get(subtask_id=subtask.pk)
    resume.pk, resume.kind, resume.included_message_ids = None, sessions.RESUME, [7, 9]
    resume.resume_reason = "resume"
    resume.save()
    sent_kind = sessions.RESUME if resumed else "full"
    with transaction.atomic():
        held = sessions._mark_sent(subtask=subtask, sent_kind=sent_kind, resumed=resumed)
        marked = _reports_as_stored(subtask.pk)
        transaction.set_rollback(True)
    # The oracle: the ORM's update and read of the same rows.
    reports = PromptReport.objects.filter(subtask_id=subtask.pk, attempt=subtask.attempts)
    reports.update(
        sent=ExpressionWrapper(Q(kind=sent_kind), output_field=BooleanField()),
        resume_reason=Case(
            When(kind=sessions.RESUME, then=Value("resumed" if resumed else "resume_failed")),
            default=F("resume_reason"),
        ),
    )
    assert marked == _reports_as_stored(subtask.pk)
    assert sorted(held) == sorted(reports.values_list("kind", "included_message_ids"))
    assert dict(held)[sessions.RESUME] == [7, 9]


def _listed_in(name: str, between: str, until: str) -> list[str]:
    text = queries.text(name)
    listed = text[text.index(between) + len(between) : text.index(until)]
    return [column.strip().split(".")[-1] for column in listed.split(",") if column.strip()]


def test_the_claimed_turn_returns_every_column_of_the_turn_then_its_task_in_the_models_order():
    """`leases._locked_turn_of` builds the turn and its task by position: a column added to
    either model must be added here."""
    selected = _listed_in("lock_claimed_turn", "\nSELECT\n", "\nFROM")
    assert selected == _columns(Subtask) + _columns(Task)


def _claimed_turns() -> tuple[Subtask, object, object]:
    """A turn claimed by one worker account, and that account and another."""
    owner = get_user_model().objects.create_user(username="owner")
    create_task(
        owner=owner,
        title="t",
        task_type="code",
        message="m",
        pipeline=[PipelineStep(executor="codex")],
    )
    holder, other = make_worker("worker-1"), make_worker("worker-2")
    [turn] = claims.claim_turns(worker=holder, worker_id="w", kinds=["codex"], limit=1)
    return turn.subtask, holder, other


def test_the_claimed_turn_is_read_as_the_orm_reads_it():
    subtask, holder, other = _claimed_turns()
    Subtask.objects.filter(pk=subtask.pk).update(
        usage={"input_tokens": 3}, progress_events=2, partial_text="so far"
    )
    asked_by = [
        (subtask.pk, holder),
        (subtask.pk, None),
        (subtask.pk, other),  # not the account holding it
        (Subtask.objects.get(task_id=subtask.task_id, role=Role.USER).pk, None),  # no turn
        (subtask.pk + 1000, None),  # no such turn
    ]
    for subtask_id, claimed_by in asked_by:
        with transaction.atomic():
            found = leases._locked_turn_of(subtask_id=subtask_id, claimed_by=claimed_by)
        with transaction.atomic():
            expected = leases._locked_turn_by_orm(subtask_id=subtask_id, claimed_by=claimed_by)
        assert (found is None) == (expected is None), (subtask_id, claimed_by)
        if expected is not None:
            assert found is not None
            assert _values(found) == _values(expected)
            assert _values(found.task) == _values(expected.task)
            assert found._state.adding is False and found._state.db == expected._state.db
    assert leases._locked_turn_of(subtask_id=subtask.pk, claimed_by=other) is None


@pytest.mark.django_db(transaction=True)
def test_the_claimed_turn_holds_the_lock_of_its_task_and_of_the_turn(shipped_bots):
    subtask, holder, _ = _claimed_turns()
    refused: list[str] = []

    def try_to_lock() -> None:
        try:
            for model, pk in ((Task, subtask.task_id), (Subtask, subtask.pk)):
                try:
                    with transaction.atomic():
                        model.objects.select_for_update(nowait=True).get(pk=pk)
                except DatabaseError:
                    refused.append(model.__name__)
        finally:
            connections.close_all()

    with transaction.atomic():
        found = leases.claimed_turn(
            worker=holder, worker_id="w", attempt=subtask.attempts, subtask_id=subtask.pk
        )
        assert (found.pk, found.task.pk) == (subtask.pk, subtask.task_id)
        other = threading.Thread(target=try_to_lock)
        other.start()
        other.join()
    assert refused == ["Task", "Subtask"]


def test_the_session_read_returns_every_column_in_the_models_order():
    assert _listed_in("native_session_of", "\nSELECT\n", "\nFROM") == _columns(NativeSession)


def test_the_session_read_finds_what_the_orm_finds():
    subtask, _, _ = _claimed_turns()
    NativeSession.objects.create(
        task_id=subtask.task_id,
        bot=subtask.bot,
        executor=subtask.executor,
        session_id="s-1",
        worker_id="w",
        seen_through_message_id=2,
        seen_message_ids=[1, 2],
        context_tokens=40,
        turns=3,
    )
    NativeSession.objects.create(
        task_id=subtask.task_id,
        bot=subtask.bot,
        executor="agno",
        session_id="s-2",
        seen_through_message_id=1,
    )
    for bot, executor in [
        (subtask.bot, subtask.executor),
        (subtask.bot, "agno"),
        (subtask.bot, "claude_code"),  # none
        ("somebody", subtask.executor),  # none
    ]:
        found = sessions.session_of(task_id=subtask.task_id, bot=bot, executor=executor)
        expected = NativeSession.objects.filter(
            task_id=subtask.task_id, bot=bot, executor=executor
        ).first()
        assert (found is None) == (expected is None), (bot, executor)
        if expected is not None:
            assert found is not None
            assert _values(found) == _values(expected)
            assert found._state.adding is False


def _session_as_stored(task_id: int) -> list[dict[str, object]]:
    return [
        {name: value for name, value in _values(row).items() if name not in _WRITTEN_AT}
        for row in NativeSession.objects.filter(task_id=task_id).order_by("bot", "executor")
    ]


_WRITTEN_AT = {"id", "created_at", "updated_at"}


def test_writing_a_session_does_what_the_orm_does():
    subtask, _, _ = _claimed_turns()
    task_id, bot = subtask.task_id, subtask.bot
    NativeSession.objects.create(
        task_id=task_id, bot=bot, executor="agno", session_id="s-0", seen_through_message_id=1
    )
    fresh = {"task_id": task_id, "bot": bot, "executor": "codex", "session_id": "s-1"}
    written = {"worker_id": "w", "seen_through_message_id": 2, "seen_message_ids": [1, 2]}
    for session in [
        NativeSession(**fresh, **written, context_tokens=40, turns=1),  # inserted
        NativeSession(**fresh, **written, context_tokens=None, turns=2),  # then updated
    ]:
        with transaction.atomic():
            sessions._write_session(session)
            by_statement = _session_as_stored(task_id)
            transaction.set_rollback(True)
        with transaction.atomic():
            # The oracle: the ORM's insert, or its update of the row read.
            stored = sessions.session_of(task_id=task_id, bot=bot, executor="codex")
            if stored is None:
                session.save(force_insert=True)
            else:
                for name in ("session_id", *written, "context_tokens", "turns"):
                    setattr(stored, name, getattr(session, name))
                stored.save(update_fields=sessions._SESSION_WRITES)
            assert by_statement == _session_as_stored(task_id)
        # The ORM's write stays: the next case updates it.
    [row] = NativeSession.objects.filter(task_id=task_id, executor="codex")
    assert (row.turns, row.context_tokens, row.seen_message_ids) == (2, None, [1, 2])
