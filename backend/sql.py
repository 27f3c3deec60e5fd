"""Written-out SQL for the queries every dispatch cycle runs.

A dispatch and its result report run about thirty queries. Built by the ORM, each costs about a
millisecond of Python on every call (filters resolved, SQL compiled), more than most of them
take in the database, and the server's CPU is what bounds how many cycles a second it serves
(`bench/bench_http_dispatch.py`). The cycle's fixed-shape queries are therefore written out where
they are used, with these helpers. Only table and column names from the models' metadata and
placeholders are formatted into the SQL; every value is a parameter.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from datetime import datetime
from functools import cache
from typing import Any, TypeVar

from django.db import connection
from django.db.models import Field, Model

M = TypeVar("M", bound=Model)


@cache
def _fields(model: type[Model], names: tuple[str, ...] | None) -> tuple[Field[Any, Any], ...]:
    """`model`'s concrete fields named (all when None), in the model's field order: the order
    `Model.from_db` takes a subset of values in."""
    fields = model._meta.concrete_fields
    if names is None:
        return tuple(fields)
    wanted = {model._meta.get_field(name).attname for name in names}
    return tuple(field for field in fields if field.attname in wanted)


def columns(model: type[Model], fields: Sequence[str] | None = None) -> str:
    """The qualified columns of `model`'s `fields` (every concrete field when None), in the
    order `rows_of` reads them."""
    table = model._meta.db_table
    return ", ".join(
        f"{table}.{field.column}"
        for field in _fields(model, None if fields is None else tuple(fields))
    )


def rows_of(
    model: type[M],
    sql: str,
    params: Sequence[Any],
    *,
    fields: Sequence[str] | None = None,
    joined: tuple[str, Sequence[str] | None] | None = None,
) -> list[M]:
    """`model` instances from `sql`, which selects `columns(model, fields)` and then, when
    `joined` is (foreign key, its model's fields), `columns(related model, fields)` of a LEFT
    JOIN: what the ORM loads for `.only(fields)` with `select_related(foreign key)` (the
    fields left out are deferred, each value converted as the ORM converts it)."""
    readers = [_reader(model, None if fields is None else tuple(fields))]
    foreign_key = None
    if joined is not None:
        foreign_key = model._meta.get_field(joined[0])
        related = foreign_key.related_model
        assert isinstance(related, type)
        readers.append(_reader(related, None if joined[1] is None else tuple(joined[1])))
    with connection.cursor() as cursor:
        cursor.execute(sql, list(params))
        rows = cursor.fetchall()
    loaded = []
    for row in rows:
        instance = readers[0].load(row)
        if foreign_key is not None:
            target = readers[1].load(row, start=readers[0].width)
            foreign_key.set_cached_value(instance, target)  # type: ignore[attr-defined]
        loaded.append(instance)
    return loaded


_readers = threading.local()  # a thread's connection converts with its own backend's functions


def _reader(model: type[Model], names: tuple[str, ...] | None) -> _Reader:
    cached: dict[tuple[Any, ...], _Reader] = _readers.__dict__.setdefault("by_key", {})
    key = (connection.alias, model, names)
    if key not in cached:
        cached[key] = _Reader(model, names)
    return cached[key]


class _Reader:
    """Makes one model's instances from its slice of a row."""

    def __init__(self, model: type[Model], names: tuple[str, ...] | None) -> None:
        self.model = model
        fields = _fields(model, names)
        self.width = len(fields)
        self.attnames = [field.attname for field in fields]
        self.pk_index = self.attnames.index(model._meta.pk.attname)  # type: ignore[union-attr]
        self.converters = []
        for index, field in enumerate(fields):
            column = field.get_col(model._meta.db_table)
            found = [
                *connection.ops.get_db_converters(column),
                *column.get_db_converters(connection),
            ]
            if found:
                self.converters.append((index, column, found))

    def load(self, row: Sequence[Any], *, start: int = 0) -> Any:
        values = list(row[start : start + self.width])
        if values[self.pk_index] is None:
            return None  # no row on the LEFT JOIN's side
        for index, column, found in self.converters:
            for converter in found:
                values[index] = converter(values[index], column, connection)
        return self.model.from_db(connection.alias, self.attnames, values)


def locking() -> str:
    """` FOR UPDATE` where the database has row locks (SQLite's IMMEDIATE transactions already
    hold its write lock, see `tasks.services.lock_task`)."""
    return " FOR UPDATE" if connection.features.has_select_for_update else ""


def placeholders(values: Sequence[Any]) -> str:
    return ", ".join("%s" for _ in values)


def when(moment: datetime) -> Any:
    """A datetime as a parameter, stored the way the ORM stores it."""
    return connection.ops.adapt_datetimefield_value(moment)
