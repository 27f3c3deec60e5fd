"""Written-out SQL for the queries every dispatch cycle runs.

A dispatch and its result report run about thirty queries. Built by the ORM, each costs about a
millisecond of Python on every call (filters resolved, SQL compiled), more than most of them
take in the database, and the server's CPU is what bounds how many cycles a second it serves
(`bench/bench_http_dispatch.py`). The cycle's fixed-shape queries are therefore written out where
they are used, with these helpers. Only table and column names from the models' metadata,
placeholders and constants of Baton's code (`literal`) are formatted into the SQL; every value
that comes from a request or a row is a parameter.
"""

from __future__ import annotations

import json
import math
import re
import threading
from collections.abc import Mapping, Sequence
from contextlib import nullcontext
from datetime import datetime
from functools import cache
from typing import Any, TypeVar

from django.db import DEFAULT_DB_ALIAS, DatabaseError, connection, connections, transaction
from django.db.models import Field, ForeignKey, Model
from django.db.models.base import ModelState
from django.db.models.signals import post_init, pre_init

M = TypeVar("M", bound=Model)
# (position in the row, column, converters): see `_converters`.
_Converters = list[tuple[int, Any, list[Any]]]
# Each thread's readers and converters: its connection converts with its backend's functions.
_readers = threading.local()


def _field(model: type[Model], name: str) -> Field[Any, Any]:
    field = model._meta.get_field(name)
    assert isinstance(field, Field)  # a concrete field (a foreign key among them)
    return field


@cache
def _fields(model: type[Model], names: tuple[str, ...] | None) -> tuple[Field[Any, Any], ...]:
    """`model`'s concrete fields named (all when None), in the model's field order: the order
    `Model.from_db` takes a subset of values in."""
    fields = model._meta.concrete_fields
    if names is None:
        return tuple(fields)
    wanted = {_field(model, name).attname for name in names}
    return tuple(field for field in fields if field.attname in wanted)


def columns(
    model: type[Model], fields: Sequence[str] | None = None, *, table: str | None = None
) -> str:
    """The columns of `model`'s `fields` (every concrete field when None), in the order
    `rows_of` reads them, qualified by `table` (the model's table when None; "" for none)."""
    return _columns(
        model,
        None if fields is None else tuple(fields),
        model._meta.db_table if table is None else table,
    )


def width(model: type[Model], fields: Sequence[str] | None = None) -> int:
    """How many columns `columns(model, fields)` names: where the next model's begin in a row
    that selects several (`models_of` reads a row from its start)."""
    return len(_fields(model, None if fields is None else tuple(fields)))


@cache
def _columns(model: type[Model], names: tuple[str, ...] | None, table: str) -> str:
    prefix = f"{table}." if table else ""
    return ", ".join(f"{prefix}{field.column}" for field in _fields(model, names))


@cache
def _path(model: type[Model], name: str) -> tuple[str, Field[Any, Any]]:
    """The qualified column and the field `name` names on `model`, following `fk__field`
    through foreign keys (whose tables the caller joins)."""
    if "__" in name:
        foreign_key, rest = name.split("__", 1)
        related = _field(model, foreign_key).related_model
        assert isinstance(related, type)
        return _path(related, rest)
    field = _field(model, name)
    return f"{model._meta.db_table}.{field.column}", field


def value_columns(model: type[Model], names: Sequence[str]) -> str:
    """The qualified columns `values_of(model, names, …)` reads, as `values_list` names them
    (`fk__field` for a joined table's column)."""
    return _value_columns(model, tuple(names))


@cache
def _value_columns(model: type[Model], names: tuple[str, ...]) -> str:
    return ", ".join(_path(model, name)[0] for name in names)


def values_of(
    model: type[Model], names: Sequence[str], sql: str, params: Sequence[Any]
) -> list[tuple[Any, ...]]:
    """The rows of `sql`, which selects `value_columns(model, names)`, each value converted as
    `values_list(*names)` converts it (JSON parsed, booleans and datetimes as Python's)."""
    db = connections[DEFAULT_DB_ALIAS]
    converters = _value_converters(db.alias, model, tuple(names))
    with db.cursor() as cursor:
        cursor.execute(sql, list(params))
        rows = cursor.fetchall()
    if not converters:
        return list(rows)
    converted = []
    for row in rows:
        values = list(row)
        for index, column, found in converters:
            for converter in found:
                values[index] = converter(values[index], column, db)
        converted.append(tuple(values))
    return converted


def _value_converters(alias: str, model: type[Model], names: tuple[str, ...]) -> _Converters:
    cached: dict[tuple[Any, ...], _Converters] = _readers.__dict__.setdefault("values", {})
    key = (alias, model, names)
    if key not in cached:
        found = []
        for name in names:
            field = _path(model, name)[1]
            found.append((field.model._meta.db_table, field))
        cached[key] = _converters(found)
    return cached[key]


def _converters(fields: Sequence[tuple[str, Field[Any, Any]]]) -> _Converters:
    """Per (table, field) of a row, by position: the backend's and the field's converters of
    the values read from the database (only the positions that have any)."""
    converters = []
    for index, (table, field) in enumerate(fields):
        column = field.get_col(table)
        found = [*connection.ops.get_db_converters(column), *column.get_db_converters(connection)]
        if found:
            converters.append((index, column, found))
    return converters


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
    with connection.cursor() as cursor:
        cursor.execute(sql, list(params))
        rows = cursor.fetchall()
    return models_of(model, rows, fields=fields, joined=joined)


def models_of(
    model: type[M],
    rows: Sequence[Sequence[Any]],
    *,
    fields: Sequence[str] | None = None,
    joined: tuple[str, Sequence[str] | None] | None = None,
) -> list[M]:
    """`rows_of`'s instances from rows already fetched (columns after those it reads are left
    to the caller)."""
    db = connections[DEFAULT_DB_ALIAS]
    readers = [_reader(model, None if fields is None else tuple(fields))]
    foreign_key: ForeignKey[Any, Any] | None = None
    if joined is not None:
        found = model._meta.get_field(joined[0])
        assert isinstance(found, ForeignKey)
        foreign_key, related = found, found.related_model
        assert isinstance(related, type)
        readers.append(_reader(related, None if joined[1] is None else tuple(joined[1])))
    loaded = []
    for row in rows:
        instance = readers[0].load(row, db)
        if foreign_key is not None:
            target = readers[1].load(row, db, start=readers[0].width)
            foreign_key.set_cached_value(instance, target)
        loaded.append(instance)
    return loaded


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
        pk = model._meta.pk
        assert pk is not None
        self.pk_index = self.attnames.index(pk.attname)
        self.converters = _converters([(model._meta.db_table, field) for field in fields])
        self.direct = (
            model.from_db.__func__ is Model.from_db.__func__  # type: ignore[attr-defined]
            and model.__init__ is Model.__init__
        )

    def load(self, row: Sequence[Any], db: Any, *, start: int = 0) -> Any:
        """The instance of `row`'s slice from `start`, read from `db` (a connection)."""
        values = list(row[start : start + self.width])
        if values[self.pk_index] is None:
            return None  # no row on the LEFT JOIN's side
        for index, column, found in self.converters:
            for converter in found:
                values[index] = converter(values[index], column, db)
        model = self.model
        if not self.direct or pre_init.has_listeners(model) or post_init.has_listeners(model):
            return model.from_db(db.alias, self.attnames, values)
        # What `from_db` makes, without its detour through `__init__` (a list of every field
        # with a DEFERRED marker, then each value set by name): the values read in the
        # instance's `__dict__`, the fields not read left out of it (deferred: loaded on
        # access), and the state of a row loaded from this database. A model that defines
        # either, or has receivers of the signals `__init__` sends, gets `from_db`.
        instance = model.__new__(model)
        instance.__dict__.update(zip(self.attnames, values, strict=True))
        state = instance._state = ModelState()
        state.adding, state.db = False, db.alias
        return instance


def locking() -> str:
    """` FOR UPDATE` where the database has row locks (SQLite's IMMEDIATE transactions already
    hold its write lock, see `tasks.services.lock_task`)."""
    return " FOR UPDATE" if connection.features.has_select_for_update else ""


# What `literal` writes into SQL: the values of Baton's own choices (statuses, roles, kinds).
_CONSTANT = re.compile(r"[A-Za-z0-9_]*")


def literal(constant: str) -> str:
    """A constant of Baton's code (a status, a role) as an SQL string literal, for a predicate
    that a partial index names. PostgreSQL prepares a statement run often and then reuses one
    generic plan, which can use a partial index only when the constant the index's predicate
    names is in the statement's text: against a parameter, it plans the statement again on
    every execution. Anything but letters, digits and underscores is refused."""
    if not _CONSTANT.fullmatch(constant):
        raise ValueError(f"not a constant to write into SQL: {constant!r}")
    return f"'{constant}'"


def placeholders(values: Sequence[Any]) -> str:
    return ", ".join("%s" for _ in values)


def case_by_id(values: Mapping[Any, Any]) -> tuple[str, list[Any]]:
    """`CASE id WHEN … THEN … END` giving each id (key) its value, and its parameters: one
    statement updates many rows, each to its own value."""
    whens = " ".join("WHEN %s THEN %s" for _ in values)
    return f"CASE id {whens} END", [item for pair in values.items() for item in pair]


def when(moment: datetime) -> Any:
    """A datetime as a parameter, stored the way the ORM stores it."""
    return connection.ops.adapt_datetimefield_value(moment)


# Under SQLite's limit on a statement's parameters (32,766) and PostgreSQL's (65,535).
MAX_PARAMETERS = 32_000


def insert(rows: Sequence[Model], *, ignore_conflicts: bool = False) -> set[Any]:
    """Insert `rows` (of one model) as `bulk_create` does: each field's value prepared as the
    ORM prepares it. With `ignore_conflicts`, a row whose key exists is skipped, and the
    primary keys of the rows inserted are returned (rows that name their own keys); otherwise
    a row whose primary key the database assigns gets it.

    On PostgreSQL the rows go in as one JSON document, an array with an object per row
    (`INSERT … SELECT … FROM jsonb_populate_recordset(…)`, see `_records`): the statement has
    one parameter and the same text whatever the number of rows, so psycopg parses it once and
    the server prepares it. A parameter per value would cost a wide row (a prompt report, 55
    columns) more Python than its round trip: psycopg caches the parsing of statements of at
    most 50 parameters only, and each value is prepared and sent on its own. Elsewhere, and
    for a row JSON cannot carry exactly, `VALUES` lists in statements under the parameter
    limit (one transaction when there are several)."""
    if not rows:
        return set()
    model = type(rows[0])
    meta = model._meta
    pk = meta.pk
    assert pk is not None
    assigned = getattr(rows[0], pk.attname) is None
    fields = [field for field in meta.concrete_fields if not (assigned and field is pk)]
    returning = assigned and not ignore_conflicts
    inserted: set[Any] = set()
    db = connections[DEFAULT_DB_ALIAS]
    record = _record_carriers(db.vendor, model, assigned)
    document = _records(rows, record, db) if record is not None else None
    per_statement = len(rows) if document is not None else max(1, MAX_PARAMETERS // len(fields))
    statements = range(0, len(rows), per_statement)
    columns = ", ".join(field.column for field in fields)
    head = f"INSERT INTO {meta.db_table} ({columns}) "
    with transaction.atomic(savepoint=False) if len(statements) > 1 else nullcontext():
        for start in statements:
            batch = rows[start : start + per_statement]
            if document is not None:
                statement = _from_document(meta.db_table, columns)
                params: list[Any] = [document]
            else:
                row_values = "(" + ", ".join("%s" for _ in fields) + ")"
                statement = head + f"VALUES {', '.join(row_values for _ in batch)}"
                params = [
                    field.get_db_prep_save(field.pre_save(row, True), db)
                    for row in batch
                    for field in fields
                ]
            if ignore_conflicts:
                statement += " ON CONFLICT DO NOTHING"
                if not assigned:
                    statement += f" RETURNING {pk.column}"
            elif returning:
                statement += f" RETURNING {pk.column}"
            with db.cursor() as cursor:
                cursor.execute(statement, params)
                if returning:
                    # Rows come back in the order they were given, from VALUES as from a
                    # set-returning function's rows (as `bulk_create` relies on for UNNEST's).
                    for row, (key,) in zip(batch, cursor.fetchall(), strict=True):
                        setattr(row, pk.attname, key)
                elif ignore_conflicts and not assigned:
                    inserted.update(key for (key,) in cursor.fetchall())
            for row in batch:
                row._state.adding = False
                row._state.db = db.alias
    return inserted


def insert_statement(rows: Sequence[Model]) -> tuple[str, list[Any]] | None:
    """`insert`'s statement for `rows` (of one model, their keys the database's to assign), to
    run inside another statement as a data-modifying `WITH` part: the rows commit with that
    statement's change, and a dispatch pays one round trip and one commit for both. Their
    keys are not read back. On PostgreSQL, as one JSON document; None elsewhere, or when a
    row is one the document cannot carry exactly: the caller then runs `insert`."""
    if not rows:
        return None
    model = type(rows[0])
    meta = model._meta
    pk = meta.pk
    assert pk is not None
    if any(getattr(row, pk.attname) is not None for row in rows):
        return None
    db = connections[DEFAULT_DB_ALIAS]
    record = _record_carriers(db.vendor, model, True)
    document = _records(rows, record, db) if record is not None else None
    if document is None:
        return None
    columns = ", ".join(field.column for field in meta.concrete_fields if field is not pk)
    return _from_document(meta.db_table, columns), [document]


def _from_document(table: str, columns: str) -> str:
    """The INSERT of `columns` into `table` from the rows of the JSON document that is its
    one parameter (see `_records`)."""
    return (
        f"INSERT INTO {table} ({columns}) SELECT {columns} "  # noqa: S608
        f"FROM jsonb_populate_recordset(NULL::{table}, %s::jsonb)"
    )


def update(row: Model, fields: Sequence[str]) -> None:
    """Write `fields` of `row` (a saved row) as `row.save(update_fields=fields)` does: each
    value prepared as the ORM prepares it (`auto_now` set), no signals sent; a row that no
    longer exists is a `DatabaseError`, as there."""
    meta = type(row)._meta
    pk = meta.pk
    assert pk is not None
    chosen = [_field(type(row), name) for name in fields]
    db = connections[DEFAULT_DB_ALIAS]
    values = [field.get_db_prep_save(field.pre_save(row, False), db) for field in chosen]
    assert not any(hasattr(value, "resolve_expression") for value in values)  # values only
    with db.cursor() as cursor:
        cursor.execute(
            f"UPDATE {meta.db_table} SET "  # noqa: S608 - only column names formatted in
            f"{', '.join(f'{field.column} = %s' for field in chosen)} WHERE {pk.column} = %s",
            [*values, pk.get_db_prep_value(row.pk, db)],
        )
        if cursor.rowcount != 1:
            raise DatabaseError(f"{meta.label} {row.pk} was not updated: no such row.")


# How `_records` writes a value of each kind of column into the JSON document: as it is (JSON
# carries it exactly, and PostgreSQL reads it back as the column's type), a datetime in ISO 8601
# with its offset, a float unless it is not finite (JSON has no NaN or infinity), a JSON
# field's value as JSON (None: SQL NULL, as the ORM stores it).
_PLAIN, _DATETIME, _FLOAT, _JSON = "plain", "datetime", "float", "json"
# The Python types each plain column's prepared value has (None aside).
_PLAIN_TYPES: dict[str, tuple[type, ...]] = {
    **dict.fromkeys(
        [
            "AutoField",
            "BigAutoField",
            "SmallAutoField",
            "IntegerField",
            "BigIntegerField",
            "SmallIntegerField",
            "PositiveIntegerField",
            "PositiveBigIntegerField",
            "PositiveSmallIntegerField",
        ],
        (int,),
    ),
    **dict.fromkeys(["CharField", "TextField", "SlugField"], (str,)),
    "BooleanField": (bool,),
}
# (column, field, kind, the plain types) per column `insert` writes.
_Carriers = list[tuple[str, Field[Any, Any], str, tuple[type, ...]]]


@cache
def _record_carriers(vendor: str, model: type[Model], assigned: bool) -> _Carriers | None:
    """How each column `insert` writes goes into the JSON document, on PostgreSQL; None
    elsewhere, or when a column is of a kind JSON does not carry exactly, or its field is not
    one of Django's own (a field class of a project may prepare its values in its own way,
    which only the `VALUES` path honours)."""
    if vendor != "postgresql":
        return None
    pk = model._meta.pk
    carriers: _Carriers = []
    for field in model._meta.concrete_fields:
        if assigned and field is pk:
            continue
        if not type(field).__module__.startswith("django.db.models."):
            return None
        target = getattr(field, "target_field", field) if field.is_relation else field
        kind = target.get_internal_type()
        if kind in _PLAIN_TYPES:
            carriers.append((field.column, field, _PLAIN, _PLAIN_TYPES[kind]))
        elif kind == "DateTimeField":
            carriers.append((field.column, field, _DATETIME, ()))
        elif kind == "FloatField":
            carriers.append((field.column, field, _FLOAT, ()))
        elif kind == "JSONField" and getattr(field, "encoder", None) is None:
            carriers.append((field.column, field, _JSON, ()))
        else:
            return None
    return carriers


def _records(rows: Sequence[Model], carriers: _Carriers, db: Any) -> str | None:
    """The rows as the JSON document `insert` sends PostgreSQL: an array of objects, one per
    row, keyed by column; a value that is None is left out, so the column is NULL. Each
    value is the ORM's prepared value where the field's own (a plain column's, in the type
    `_PLAIN_TYPES` names) is not already it. None when a value is one JSON cannot carry (a
    float that is not finite, or a value the ORM writes with an expression)."""
    records = []
    for row in rows:
        record: dict[str, Any] = {}
        for column, field, kind, types in carriers:
            value = field.pre_save(row, True)  # sets auto_now(_add) on the row
            if kind == _PLAIN:
                if value is not None and type(value) not in types:
                    value = field.get_db_prep_save(value, db)
                    if value is not None and not isinstance(value, types):
                        return None
            elif kind == _DATETIME:
                value = field.get_db_prep_save(value, db)
                if value is not None:
                    if not isinstance(value, datetime):
                        return None
                    value = value.isoformat()
            elif kind == _FLOAT:
                value = field.get_db_prep_save(value, db)
                if value is not None and not (
                    isinstance(value, int | float) and math.isfinite(value)
                ):
                    return None
            elif hasattr(value, "resolve_expression"):
                return None
            if value is not None:
                record[column] = value
        records.append(record)
    return json.dumps(records, ensure_ascii=False, separators=(",", ":"))
