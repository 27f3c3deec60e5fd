"""Every SQL statement Baton writes by hand, by name, and how to run one.

The statements are in this package's `.sql` files, one file per area (`dispatch.sql`, …),
each statement under a line `-- name: <name>` and the comment that says what it does and the
measured win that keeps it written out (the ORM does everything else). They run on
PostgreSQL only: SQLite, the embedded default, runs the ORM's queries, which are also each
statement's test oracle (`tests/queries/`).

A statement's text is SQL as PostgreSQL reads it, with two kinds of holes:

- `%(name)s`: a parameter, sent apart from the text (every value from a request or a row);
- `{name}`: composed into the text with `psycopg.sql` before the statement first runs. A
  model's name in lower case (`{subtask}`, `{nativesession}`) is that model's table, as an
  identifier; a name ending in `_table` (`{along_table}`) is a model the caller gives, as its
  table; one ending in `_count` (`{request_count}`) a number the caller gives, as a literal;
  any other name is a constant of Baton's code given by the caller (a status, a role), as a
  literal. PostgreSQL can match a partial index's predicate only against a constant in the
  statement's text, never against a parameter; and the plan it keeps for a prepared
  statement (made once, for any parameters) counts the elements of an array parameter as 100
  unless a count in the text bounds them.

A statement is composed once per process and set of constants, and the same text is then sent
on every call, so psycopg prepares it on the server after a few runs.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from functools import cache
from pathlib import Path
from typing import Any

from django.apps import apps
from django.db import connection
from django.db.models import Model
from psycopg import sql as psycopg_sql

_HERE = Path(__file__).parent
_NAME_LINE = re.compile(r"^-- name: ([a-z_][a-z0-9_]*)\s*$", re.MULTILINE)


class UnknownStatement(LookupError):
    """No `.sql` file of this package names a statement so."""


@cache
def _statements() -> dict[str, str]:
    """Every statement of the package's `.sql` files by name (its text from its name line to
    the next name line; comment lines stay, for `text`)."""
    found: dict[str, str] = {}
    for path in sorted(_HERE.glob("*.sql")):
        text = path.read_text(encoding="utf-8")
        marks = list(_NAME_LINE.finditer(text))
        for index, mark in enumerate(marks):
            end = marks[index + 1].start() if index + 1 < len(marks) else len(text)
            name = mark.group(1)
            if name in found:
                raise ValueError(f"statement {name!r} is named twice ({path.name})")
            found[name] = text[mark.end() : end].strip() + "\n"
    return found


def names() -> list[str]:
    """The names of every statement, sorted."""
    return sorted(_statements())


def text(name: str) -> str:
    """A statement's text as written, holes and all."""
    try:
        return _statements()[name]
    except KeyError:
        raise UnknownStatement(name) from None


@cache
def _tables() -> dict[str, str]:
    """Each model's table by the model's name in lower case (unique across Baton's apps)."""
    tables: dict[str, str] = {}
    for model in apps.get_models():
        name = model._meta.model_name
        assert name is not None
        if name in tables and tables[name] != model._meta.db_table:
            tables[name] = ""  # two models share the name: neither may be named in a statement
        else:
            tables[name] = model._meta.db_table
    return tables


# What a caller gives a `{…}` hole: a constant (a literal) or a model (its table).
Constant = str | int | type[Model]


def compose(name: str, constants: Mapping[str, Constant] | None = None) -> str:
    """The statement `name` as sent to PostgreSQL: its `{…}` holes filled (see the module's
    docstring) and its `%(…)s` parameters left for the driver."""
    return _compose(name, tuple(sorted((constants or {}).items(), key=lambda item: item[0])))


@cache
def _compose(name: str, constants: tuple[tuple[str, Constant], ...]) -> str:
    given = dict(constants)
    tables = _tables()
    statement = _unindented(_without_comments(text(name)))
    holes: dict[str, psycopg_sql.Composable] = {}
    for hole in _holes(statement):
        if hole in given:
            holes[hole] = _given(name, hole, given.pop(hole))
        elif tables.get(hole):
            holes[hole] = psycopg_sql.Identifier(tables[hole])
        else:
            raise KeyError(f"statement {name!r}: {{{hole}}} is neither a model nor a constant")
    if given:
        raise KeyError(f"statement {name!r} has no hole for {sorted(given)}")
    composed = psycopg_sql.SQL(statement).format(**holes)
    connection.ensure_connection()
    return composed.as_string(connection.connection)


def _given(name: str, hole: str, value: Constant) -> psycopg_sql.Composable:
    """What the caller's `value` for `{hole}` composes to: a `*_table` hole's model as its
    table, a `*_count` hole's number and any other hole's constant as a literal."""
    kind = "table" if hole.endswith("_table") else "count" if hole.endswith("_count") else ""
    is_model = isinstance(value, type) and issubclass(value, Model)
    is_count = isinstance(value, int) and not isinstance(value, bool) and value >= 0
    wanted = {"table": "a model", "count": "a number"}.get(kind, "a constant")
    if (kind == "table") != is_model or (kind == "count") != is_count:
        raise TypeError(f"statement {name!r}: {{{hole}}} takes {wanted}, not {value!r}")
    if isinstance(value, type):
        return psycopg_sql.Identifier(value._meta.db_table)
    return psycopg_sql.Literal(value)


_COMMENT_LINE = re.compile(r"^\s*--.*\n?", re.MULTILINE)


def _without_comments(statement: str) -> str:
    """The statement without its whole-line comments: they are for readers, and a brace or a
    percent sign in one would otherwise read as a hole or a parameter."""
    return _COMMENT_LINE.sub("", statement)


_INDENT = re.compile(r"^[ \t]+", re.MULTILINE)


def _unindented(statement: str) -> str:
    """The statement without its lines' indentation, which only readers need: psycopg keeps
    its parse of a statement's text (where the parameters are) only up to 4 KB
    (`psycopg._queries.MAX_CACHED_STATEMENT_LENGTH`), and parses a longer one on every call."""
    return _INDENT.sub("", statement)


_HOLE = re.compile(r"(?<!\{)\{([a-z_][a-z0-9_]*)\}(?!\})")


def _holes(statement: str) -> set[str]:
    return set(_HOLE.findall(statement))


def fetch(
    name: str, params: Mapping[str, Any], constants: Mapping[str, Constant] | None = None
) -> list[tuple[Any, ...]]:
    """Run the statement `name` with its parameters and return its rows."""
    _require_postgresql(name)
    with connection.cursor() as cursor:
        cursor.execute(compose(name, constants), dict(params))
        return list(cursor.fetchall())


def execute(
    name: str, params: Mapping[str, Any], constants: Mapping[str, Constant] | None = None
) -> int:
    """Run the statement `name`, which returns no rows, and say how many rows it changed."""
    _require_postgresql(name)
    with connection.cursor() as cursor:
        cursor.execute(compose(name, constants), dict(params))
        return int(cursor.rowcount)


def _require_postgresql(name: str) -> None:
    if connection.vendor != "postgresql":
        raise RuntimeError(f"statement {name!r} is PostgreSQL's; {connection.vendor} runs the ORM")
