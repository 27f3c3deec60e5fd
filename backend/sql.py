"""Written-out SQL for the queries every dispatch cycle runs.

A dispatch and its result report run about thirty queries. Built by the ORM, each costs about a
millisecond of Python on every call (filters resolved, SQL compiled), more than most of them
take in the database, and the server's CPU is what bounds how many cycles a second it serves
(`bench/bench_http_dispatch.py`). The cycle's fixed-shape queries are therefore written out where
they are used, with these helpers. Only table and column names from the models' metadata and
placeholders are formatted into the SQL; every value is a parameter.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from functools import cache
from typing import Any, TypeVar

from django.db import connection
from django.db.models import Model

M = TypeVar("M", bound=Model)


@cache
def _concrete(model: type[Model]) -> tuple[str, tuple[str, ...]]:
    fields = model._meta.concrete_fields
    return ", ".join(field.column for field in fields), tuple(field.attname for field in fields)


def columns(model: type[Model]) -> str:
    """Every column of `model`'s table, in field order: what `rows_of` reads."""
    return _concrete(model)[0]


def rows_of(model: type[M], sql: str, params: Sequence[Any]) -> list[M]:
    """`model` instances from `sql`, which selects `columns(model)` in that order; they are
    what the ORM would have loaded (each field's value converted as the ORM converts it)."""
    table = model._meta.db_table
    attnames = _concrete(model)[1]
    converters = []
    for index, field in enumerate(model._meta.concrete_fields):
        column = field.get_col(table)
        found = [*connection.ops.get_db_converters(column), *column.get_db_converters(connection)]
        if found:
            converters.append((index, column, found))
    with connection.cursor() as cursor:
        cursor.execute(sql, list(params))
        rows = cursor.fetchall()
    loaded = []
    for row in rows:
        values = list(row)
        for index, column, found in converters:
            for converter in found:
                values[index] = converter(values[index], column, connection)
        loaded.append(model.from_db(connection.alias, attnames, values))
    return loaded


def locking() -> str:
    """` FOR UPDATE` where the database has row locks (SQLite's IMMEDIATE transactions already
    hold its write lock, see `tasks.services.lock_task`)."""
    return " FOR UPDATE" if connection.features.has_select_for_update else ""


def placeholders(values: Sequence[Any]) -> str:
    return ", ".join("%s" for _ in values)


def when(moment: datetime) -> Any:
    """A datetime as a parameter, stored the way the ORM stores it."""
    return connection.ops.adapt_datetimefield_value(moment)
