"""The written-out SQL helpers load rows exactly as the ORM would (`backend.sql`)."""

from __future__ import annotations

import pytest
from django.db import DatabaseError, connection
from django.test.utils import CaptureQueriesContext

from backend import sql
from backend.artifacts.models import Artifact
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
    # PostgreSQL takes the rows as one array per column: 6 parameters, whatever the count.
    assert len(inserts) == (1 if connection.vendor == "postgresql" else 2)
    assert list(
        TaskEvent.objects.filter(seq__gte=2000).order_by("seq").values_list("pk", flat=True)
    ) == [event.pk for event in events]


@pytest.mark.skipif(
    connection.vendor != "postgresql", reason="UNNEST of typed arrays is PostgreSQL's"
)
def test_postgresql_inserts_any_number_of_rows_with_one_statement_text(task):
    texts = []
    sent: list[tuple[str, int]] = []

    def record(execute, statement, params, many, context):
        sent.append((statement, len(params)))
        return execute(statement, params, many, context)

    for count in (2, 3, 40):
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
        assert parameters == 6  # one array per column
        texts.append(statement)
        stored = TaskEvent.objects.filter(seq__gte=3000 + 100 * count, seq__lt=3100 + 100 * count)
        assert {event.seq: (event.pk, event.data) for event in stored} == {
            event.seq: (event.pk, event.data) for event in events
        }
    assert len(set(texts)) == 1


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
