"""The written-out SQL helpers load rows exactly as the ORM would (`backend.sql`)."""

from __future__ import annotations

import math

import pytest
from django.db import DatabaseError, IntegrityError, connection, transaction
from django.db.models.signals import post_init
from django.test.utils import CaptureQueriesContext
from hypothesis import HealthCheck, given
from hypothesis import settings as examples
from hypothesis import strategies as st

from backend import sql
from backend.artifacts.models import Artifact
from backend.dispatch.models import PromptReport
from backend.tasks.factories import conversation
from backend.tasks.models import Subtask, Task, TaskEvent
from backend.tasks.services import PipelineStep

pytestmark = pytest.mark.django_db

POINTER = ("id", "kind", "size_chars", "size_lines")


def _field_values(instance, names) -> dict:
    return {name: getattr(instance, name) for name in names}


@pytest.fixture
def task(user, settings) -> Task:
    settings.BATON_SPILL_THRESHOLD_CHARS = 200
    settings.BATON_PREVIEW_HEAD_CHARS = 40
    settings.BATON_PREVIEW_TAIL_CHARS = 40
    return conversation(
        owner=user,
        messages=["Fix the build.", "Now the docs."],
        answers=["x" * 500],  # spilled to an artifact
        pipeline=[PipelineStep(executor="codex")],
    )


def test_whole_rows_equal_the_orms_in_every_field(task):
    table = Subtask._meta.db_table
    loaded = sql.rows_of(
        Subtask,
        f"SELECT {sql.columns(Subtask)} FROM {table} WHERE task_id = %s ORDER BY message_id",  # noqa: S608
        [task.pk],
    )
    expected = list(Subtask.objects.filter(task=task).order_by("message_id"))
    names = [field.attname for field in Subtask._meta.concrete_fields]
    assert [_field_values(row, names) for row in loaded] == [
        _field_values(row, names) for row in expected
    ]
    # The same attributes set, none more (a field not read is deferred: absent).
    assert [set(vars(row)) for row in loaded] == [set(vars(row)) for row in expected]
    # JSON, datetimes and booleans come back as the ORM's Python values, not the driver's.
    answer = loaded[1]
    assert answer.result == expected[1].result and isinstance(answer.result, dict)
    assert answer.finished_at == expected[1].finished_at and answer.finished_at.tzinfo
    assert answer.history_is_preview is True
    assert answer._state.adding is False and answer._state.db == "default"

    tasks = sql.rows_of(
        Task,
        f"SELECT {sql.columns(Task)} FROM {Task._meta.db_table} WHERE id = %s",  # noqa: S608
        [task.pk],
    )
    assert tasks[0].pipeline == task.pipeline and isinstance(tasks[0].pipeline, list)


def test_some_fields_and_a_joined_row_load_like_only_with_select_related(
    task, django_assert_num_queries
):
    table, artifacts = Subtask._meta.db_table, Artifact._meta.db_table
    own = ("id", "task_id", "message_id", "role", "history_text", "artifact")
    loaded = sql.rows_of(
        Subtask,
        f"SELECT {sql.columns(Subtask, own)}, {sql.columns(Artifact, POINTER)} FROM {table} "  # noqa: S608
        f"LEFT JOIN {artifacts} ON {artifacts}.id = {table}.artifact_id "
        f"WHERE {table}.task_id = %s ORDER BY {table}.message_id",
        [task.pk],
        fields=own,
        joined=("artifact", POINTER),
    )
    expected = list(
        Subtask.objects.filter(task=task)
        .select_related("artifact")
        .only(*own, *(f"artifact__{name}" for name in POINTER))
        .order_by("message_id")
    )
    assert [row.get_deferred_fields() for row in loaded] == [
        row.get_deferred_fields() for row in expected
    ]
    assert "result" in loaded[1].get_deferred_fields()
    for row, orm in zip(loaded, expected, strict=True):
        assert _field_values(row, ["id", "message_id", "role", "history_text"]) == (
            _field_values(orm, ["id", "message_id", "role", "history_text"])
        )
    first, spilled = loaded[0], loaded[1]
    assert first.artifact_id is None and spilled.artifact_id is not None
    with django_assert_num_queries(0):  # both came with the row, the missing one as None
        assert first.artifact is None
        assert _field_values(spilled.artifact, POINTER) == _field_values(
            expected[1].artifact, POINTER
        )
    assert spilled.artifact.get_deferred_fields() == expected[1].artifact.get_deferred_fields()
    # A deferred field still loads on access, as the ORM's does.
    assert spilled.result == expected[1].result


def test_rows_are_made_through_init_for_its_signals_receivers(task):
    """A model whose instances a receiver of `post_init` (or `pre_init`) watches gets them
    made by `from_db`, as the ORM makes them."""
    seen = []

    def receiver(sender, instance, **kwargs):
        seen.append(instance.pk)

    sql_text = f"SELECT {sql.columns(Task)} FROM {Task._meta.db_table} WHERE id = %s"  # noqa: S608
    assert sql.rows_of(Task, sql_text, [task.pk]) and seen == []
    post_init.connect(receiver, sender=Task)
    try:
        [loaded] = sql.rows_of(Task, sql_text, [task.pk])
    finally:
        post_init.disconnect(receiver, sender=Task)
    assert seen == [task.pk] and loaded.title == task.title
    assert loaded._state.adding is False and loaded._state.db == "default"


def test_values_equal_values_list_with_a_joined_tables_columns(task):
    names = ("message_id", "history_is_preview", "preview_layout", "result", "artifact__kind")
    table, artifacts = Subtask._meta.db_table, Artifact._meta.db_table
    loaded = sql.values_of(
        Subtask,
        names,
        f"SELECT {sql.value_columns(Subtask, names)} FROM {table} "  # noqa: S608
        f"LEFT JOIN {artifacts} ON {artifacts}.id = {table}.artifact_id "
        f"WHERE {table}.task_id = %s ORDER BY {table}.message_id",
        [task.pk],
    )
    expected = list(Subtask.objects.filter(task=task).order_by("message_id").values_list(*names))
    assert loaded == expected
    spilled = loaded[1]
    assert spilled[1] is True and isinstance(spilled[2], dict) and isinstance(spilled[3], dict)
    assert spilled[4] == expected[1][4] is not None


def test_inserted_rows_read_back_as_the_orms(task):
    data = {"subtask_id": 1, "text": "naïve ✓", "nested": [1, {"a": None}]}
    events = [
        TaskEvent(task_id=task.pk, seq=1000 + offset, type="turn.progress", data=data)
        for offset in range(3)
    ]
    sql.insert(events)
    assert all(event.pk is not None and not event._state.adding for event in events)
    stored = {event.pk: event for event in TaskEvent.objects.filter(seq__gte=1000)}
    assert sorted(stored) == sorted(event.pk for event in events)
    for event in events:
        assert stored[event.pk].data == data and stored[event.pk].seq == event.seq
        assert stored[event.pk].created_at == event.created_at

    # A key that exists is skipped, and the row that holds it is left as it was.
    existing = Artifact.objects.filter(composite=False).first()
    clash = Artifact(
        **{
            field.attname: getattr(existing, field.attname)
            for field in Artifact._meta.concrete_fields
        }
    )
    clash.size_chars = existing.size_chars + 1
    sql.insert([clash], ignore_conflicts=True)
    existing.refresh_from_db()
    assert existing.size_chars == clash.size_chars - 1


def test_many_rows_are_inserted_in_statements_under_the_parameter_limit(task, monkeypatch):
    monkeypatch.setattr(sql, "MAX_PARAMETERS", 20)  # 6 columns (the id is assigned): 3 rows
    events = [
        TaskEvent(task_id=task.pk, seq=2000 + offset, type="turn.progress", data={})
        for offset in range(5)
    ]
    with CaptureQueriesContext(connection) as captured:
        sql.insert(events)
    inserts = [query for query in captured.captured_queries if query["sql"].startswith("INSERT")]
    # PostgreSQL takes the rows as one JSON document, whatever the count.
    assert len(inserts) == (1 if connection.vendor == "postgresql" else 2)
    assert list(
        TaskEvent.objects.filter(seq__gte=2000).order_by("seq").values_list("pk", flat=True)
    ) == [event.pk for event in events]


@pytest.mark.skipif(
    connection.vendor != "postgresql", reason="the rows as one JSON document is PostgreSQL's"
)
def test_postgresql_inserts_any_number_of_rows_with_one_statement_text(task):
    texts = []
    sent: list[tuple[str, int]] = []

    def record(execute, statement, params, many, context):
        sent.append((statement, len(params)))
        return execute(statement, params, many, context)

    for count in (1, 2, 3, 40):
        events = [
            TaskEvent(
                task_id=task.pk,
                seq=3000 + 100 * count + offset,
                type="turn.progress",
                data=["a", offset] if offset % 2 else {"n": offset, "text": "naïve ✓"},
            )
            for offset in range(count)
        ]
        sent.clear()
        with connection.execute_wrapper(record):
            sql.insert(events)
        [(statement, parameters)] = sent
        assert parameters == 1  # the rows, as one JSON document
        texts.append(statement)
        stored = TaskEvent.objects.filter(seq__gte=3000 + 100 * count, seq__lt=3100 + 100 * count)
        assert {event.seq: (event.pk, event.data) for event in stored} == {
            event.seq: (event.pk, event.data) for event in events
        }
    assert len(set(texts)) == 1


def _report(task: Task, **values) -> PromptReport:
    """A prompt report of `task`'s answered turn, every column set (`values` override)."""
    turn = task.subtasks.filter(role="ASSISTANT").order_by("message_id").first()
    fields = {
        "subtask_id": turn.pk,
        "task_id": task.pk,
        "attempt": 1,
        "worker_id": "worker-1",
        "claimed_by_id": task.owner_id,
        "policy_source": "settings",
        "policy_version": None,
        "history_enabled": True,
        "context_passing": "original_and_previous",
        "messages_considered": 2,
        "messages_included": 2,
        "messages_omitted": 0,
        "omitted_user": 0,
        "omitted_assistant": 0,
        "truncated": [{"message_id": 2, "removed_chars": 460}],
        "truncated_count": 1,
        "sections": ["history", "current_message"],
        "chars": 1200,
        "tokens": 300,
        "history_tokens": 200,
        "current_tokens": 100,
        "previous_result_tokens": 0,
        "token_encoding": "cl100k_base",
        "max_tokens_fraction": 0.1,
        "first_user_message_pinned": False,
        "build_ms": 1.25,
        "policy_snapshot": {"max_messages": 20, "nested": {"list": [1, 2.5, None, True]}},
        "input_snapshot": {},
    }
    return PromptReport(**{**fields, **values})


def _stored(report: PromptReport) -> dict:
    row = PromptReport.objects.filter(pk=report.pk).values().get()
    del row["id"]
    return row


# A column's text: any character a text column stores (not NUL, no lone surrogate).
_TEXT = st.text(st.characters(exclude_categories=["Cs"], exclude_characters="\x00"), max_size=30)
_JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**62), max_value=2**62)
    | st.floats(allow_nan=False, allow_infinity=False)
    | _TEXT,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(_TEXT, inner, max_size=4),
    max_leaves=12,
)


# The task is only read, and each example deletes the rows it stored.
@examples(max_examples=60, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    worker_id=_TEXT.filter(lambda text: len(text) <= 64),
    tokens=st.integers(min_value=0, max_value=2**31 - 1),
    fraction=st.none() | st.floats(allow_nan=False, allow_infinity=False),
    build_ms=st.floats(allow_nan=False, allow_infinity=False),
    pinned=st.booleans(),
    snapshot=st.dictionaries(_TEXT, _JSON, max_size=5),
    sections=st.lists(_JSON, max_size=5),
)
def test_a_row_is_stored_as_the_orm_stores_it(
    task, worker_id, tokens, fraction, build_ms, pinned, snapshot, sections
):
    values = {
        "worker_id": worker_id,
        "tokens": tokens,
        "max_tokens_fraction": fraction,
        "build_ms": build_ms,
        "first_user_message_pinned": pinned,
        "policy_snapshot": snapshot,
        "sections": sections,
    }
    by_orm = _report(task, **values)
    by_orm.save()
    inserted = _report(task, **values)
    sql.insert([inserted])
    assert inserted.pk is not None and inserted.pk != by_orm.pk
    stored = _stored(inserted)
    # The moment `auto_now_add` gave the row is on it, as after `save()`.
    assert stored.pop("created_at") == inserted.created_at
    expected = _stored(by_orm)
    del expected["created_at"]
    assert stored == expected
    PromptReport.objects.filter(pk__in=[by_orm.pk, inserted.pk]).delete()


def test_a_float_json_cannot_carry_is_stored_too(task):
    """JSON has no infinity or NaN: such a row goes in with a parameter per value."""
    reports = [_report(task, build_ms=math.inf), _report(task, max_tokens_fraction=-math.inf)]
    sql.insert(reports)
    stored = PromptReport.objects.filter(pk__in=[report.pk for report in reports])
    assert sorted(stored.values_list("build_ms", "max_tokens_fraction")) == [
        (1.25, -math.inf),
        (math.inf, 0.1),
    ]


def test_an_insert_statement_run_inside_another_stores_rows_as_the_orm(task):
    """`insert_statement` as the data-modifying part of another statement (as the claim's
    events statement runs it): the rows stored equal the ORM's; where they cannot go as a
    JSON document (elsewhere than PostgreSQL, a float JSON cannot carry, a row with its own
    key), there is no statement and the caller inserts them."""
    by_orm = _report(task, worker_id="naïve ✓")
    by_orm.save()
    written = [
        _report(task, worker_id="naïve ✓"),
        _report(task, worker_id="naïve ✓", attempt=2, sections=[]),
    ]
    statement = sql.insert_statement(written)
    assert sql.insert_statement([_report(task, build_ms=math.inf)]) is None
    assert sql.insert_statement([by_orm]) is None
    assert sql.insert_statement([]) is None
    if connection.vendor != "postgresql":
        assert statement is None
        return
    assert statement is not None
    text, params = statement
    with connection.cursor() as cursor:
        cursor.execute(f"WITH written AS ({text}) SELECT 1", params)
    stored = [
        {key: value for key, value in row.items() if key not in ("id", "created_at")}
        for row in PromptReport.objects.exclude(pk=by_orm.pk).order_by("attempt").values()
    ]
    expected = _stored(by_orm)
    del expected["created_at"]
    assert stored == [expected, {**expected, "attempt": 2, "sections": []}]


def test_a_json_value_of_none_is_sql_null_as_with_the_orm(task):
    """The ORM stores a JSON field's None as SQL NULL (not JSON null): a NOT NULL column
    refuses it, from `insert` as from `bulk_create`."""
    for write in (sql.insert, TaskEvent.objects.bulk_create):
        with pytest.raises(IntegrityError), transaction.atomic():
            write([TaskEvent(task_id=task.pk, seq=5000, type="turn.progress", data=None)])
    assert not TaskEvent.objects.filter(seq=5000).exists()


def test_a_fields_own_preparation_is_kept(task):
    """A field class of Baton's prepares its value its own way: a lossless JSON result that
    is a string is stored as JSON text, as the ORM stores it."""
    answer = task.subtasks.filter(role="ASSISTANT").order_by("message_id").first()
    copy = Subtask.objects.get(pk=answer.pk)
    copy.pk, copy.message_id, copy.result = None, 99, "plain words"
    copy._state.adding = True
    sql.insert([copy])
    assert Subtask.objects.get(pk=copy.pk).result == "plain words"
    with connection.cursor() as cursor:
        table = Subtask._meta.db_table
        cursor.execute(f"SELECT result FROM {table} WHERE id = %s", [copy.pk])  # noqa: S608
        assert cursor.fetchone()[0] == '"plain words"'


@pytest.mark.parametrize("constant", ["RUNNING", "ASSISTANT", "turn", "claude_code", ""])
def test_a_constant_is_written_as_a_string_literal(constant):
    assert sql.literal(constant) == f"'{constant}'"


@pytest.mark.parametrize("value", ["it's", "a b", "x'; DROP TABLE tasks_task; --", "é", "\\"])
def test_anything_but_a_plain_constant_is_refused(value):
    with pytest.raises(ValueError, match="not a constant"):
        sql.literal(value)


def test_an_update_writes_the_fields_named_as_save_with_update_fields_does(task):
    turn = task.subtasks.filter(role="ASSISTANT").first()
    before = Subtask.objects.get(pk=turn.pk)
    turn.error, turn.result, turn.message = "late", {"value": "new", "n": [1, 2]}, "not written"
    with CaptureQueriesContext(connection) as queries:
        sql.update(turn, ["error", "result", "updated_at"])
    assert len(queries) == 1
    stored = Subtask.objects.get(pk=turn.pk)
    assert (stored.error, stored.result) == ("late", {"value": "new", "n": [1, 2]})
    assert stored.message == before.message  # not named: left as stored
    assert stored.updated_at == turn.updated_at > before.updated_at  # auto_now, as save sets it


def test_an_update_of_a_row_that_is_gone_fails(task):
    turn = task.subtasks.first()
    Subtask.objects.filter(pk=turn.pk).delete()
    with pytest.raises(DatabaseError, match="not updated"):
        sql.update(turn, ["error"])
