"""The home of Baton's hand-written SQL (`backend.queries`): every statement named once,
composed against real tables, parsed by PostgreSQL, used by the code, and the only SQL the
code writes by hand."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from django.db import connection
from psycopg._queries import MAX_CACHED_STATEMENT_LENGTH

from backend import queries
from backend.tasks.models import Task

ROOT = Path(__file__).resolve().parents[2]
_PARAMETER = re.compile(r"%\((\w+)\)s")


def _code() -> str:
    return "\n".join(
        path.read_text(encoding="utf-8")
        for package in ("backend", "executors")
        for path in (ROOT / package).rglob("*.py")
        if "migrations" not in path.parts and "queries" not in path.parts
    )


def test_each_statement_is_named_once_and_used_by_the_code():
    code = _code()
    unused = [name for name in queries.names() if f'"{name}"' not in code]
    assert unused == []


def test_a_name_given_twice_is_refused(tmp_path, monkeypatch):
    (tmp_path / "a.sql").write_text("-- name: twice\nSELECT 1;\n-- name: twice\nSELECT 2;\n")
    monkeypatch.setattr(queries, "_HERE", tmp_path)
    queries._statements.cache_clear()
    try:
        with pytest.raises(ValueError, match="named twice"):
            queries.names()
    finally:
        queries._statements.cache_clear()


def test_an_unknown_statement_is_refused():
    with pytest.raises(queries.UnknownStatement):
        queries.text("no_such_statement")


@pytest.mark.django_db
def test_sqlite_runs_no_statement(is_postgres):
    if is_postgres:
        pytest.skip("PostgreSQL runs the statements")
    with pytest.raises(RuntimeError, match="runs the ORM"):
        queries.fetch("any_statement", {})


@pytest.mark.postgres_only
@pytest.mark.django_db
@pytest.mark.parametrize("name", queries.names())
def test_postgresql_parses_each_statement(name):
    """Every statement composes (each `{hole}` a table or a constant its caller gives) and
    PostgreSQL prepares it: its tables, columns and the types of its parameters exist."""
    statement = queries.text(name)
    constants = {
        hole: Task if hole.endswith("_table") else 1 if hole.endswith("_count") else "x"
        for hole in queries._holes(queries._without_comments(statement))
        if not queries._tables().get(hole)
    }
    composed = queries.compose(name, constants)
    numbered: dict[str, int] = {}
    prepared = _PARAMETER.sub(
        lambda found: f"${numbered.setdefault(found.group(1), len(numbered) + 1)}", composed
    )
    with connection.cursor() as cursor:
        cursor.execute(f"PREPARE baton_check AS {prepared.replace('%%', '%')}")  # noqa: S608
        cursor.execute("DEALLOCATE baton_check")
    # psycopg parses a longer text on every call (where its parameters are) instead of once;
    # the margin leaves room for constants longer than these.
    assert len(composed.encode()) <= MAX_CACHED_STATEMENT_LENGTH - 256, len(composed.encode())


@pytest.mark.postgres_only
@pytest.mark.django_db
def test_a_statement_is_composed_with_tables_as_identifiers_and_constants_as_literals(
    tmp_path, monkeypatch
):
    (tmp_path / "sample.sql").write_text(
        "-- name: sample\n-- A comment goes, with its {brace} and 100% sign.\n"
        "SELECT id FROM {task} WHERE status = {running} AND id = %(id)s AND '{{}}' <> ''\n"
        "-- name: given_table\nSELECT id FROM {given_table}\n"
        "-- name: given_count\nSELECT id FROM {task} LIMIT {row_count}\n"
    )
    monkeypatch.setattr(queries, "_HERE", tmp_path)
    queries._statements.cache_clear()
    queries._compose.cache_clear()
    try:
        composed = queries.compose("sample", {"running": "it's RUNNING"})
        assert composed == (
            "SELECT id FROM \"tasks_task\" WHERE status = 'it''s RUNNING' AND id = %(id)s"
            " AND '{}' <> ''\n"
        )
        assert queries.fetch("sample", {"id": 1}, {"running": "x"}) == []
        with pytest.raises(KeyError, match="neither a model nor a constant"):
            queries.compose("sample")
        with pytest.raises(KeyError, match="no hole"):
            queries.compose("sample", {"running": "x", "other": "y"})
        with pytest.raises(TypeError, match="takes a constant"):
            queries.compose("sample", {"running": Task})
        assert queries.compose("given_table", {"given_table": Task}) == (
            'SELECT id FROM "tasks_task"\n'
        )
        with pytest.raises(TypeError, match="takes a model"):
            queries.compose("given_table", {"given_table": "tasks_task"})
        assert queries.compose("given_count", {"row_count": 3}) == (
            'SELECT id FROM "tasks_task" LIMIT 3\n'
        )
        for wrong in ("3", -1, True, Task):
            with pytest.raises(TypeError, match="takes a number"):
                queries.compose("given_count", {"row_count": wrong})
        with pytest.raises(TypeError, match="takes a constant"):
            queries.compose("sample", {"running": 3})
    finally:
        queries._statements.cache_clear()
        queries._compose.cache_clear()
