"""Model instances from the columns a named statement (`backend.queries`) returns, and new
rows as a document a statement inserts.

A statement lists a model's columns in the model's field order; each value is converted as
the ORM converts what it reads (the backend's converters, then the field's, such as a JSON
column's) and the instance is built by `Model.from_db`, so it is the row the ORM would load.

New rows travel as one JSON array of objects, column name to value, which PostgreSQL turns
into rows of the table's type (`jsonb_populate_recordset`); each value is the field's own
(`pre_save` then `get_prep_value`, as `save()` prepares it), in JSON as Django's encoder
writes it (a moment in ISO 8601).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from functools import cache
from typing import Any, TypeVar

from django.core.serializers.json import DjangoJSONEncoder
from django.db import connection
from django.db.models import Model
from django.db.models.expressions import Col

M = TypeVar("M", bound=Model)

Converter = Callable[[Any, Any, Any], Any]


def instance_of(model: type[M], values: Sequence[Any], fields: tuple[str, ...] | None = None) -> M:
    """The `model` instance of `values`, one per concrete field in the model's field order
    (`fields` only, when named: the rest deferred, as `only()` leaves them)."""
    names, converters = _converters(model, connection.alias, fields)
    converted = []
    for (column, field_converters), value in zip(converters, values, strict=True):
        for converter in field_converters:
            value = converter(value, column, connection)
        converted.append(value)
    return model.from_db(connection.alias, names, converted)


@cache
def _converters(
    model: type[Model], alias: str, fields: tuple[str, ...] | None
) -> tuple[list[str], list[tuple[Col, list[Converter]]]]:
    """Each concrete field's attribute name (of `fields` only, when named), and its column
    with the converters of its values (the same for every row: found once per model, fields
    and database)."""
    names, converters = [], []
    for field in model._meta.concrete_fields:
        if fields is not None and field.name not in fields:
            continue
        column = field.get_col(model._meta.db_table)
        names.append(field.attname)
        converters.append(
            (
                column,
                [
                    *connection.ops.get_db_converters(column),
                    *column.get_db_converters(connection),
                ],
            )
        )
    return names, converters


def document(rows: Sequence[Model]) -> str:
    """`rows` (new instances, of one model) as the JSON array a statement inserts: each
    object maps every concrete column but the primary key (the table's identity gives it)
    to its value as `save()` would write it."""
    objects = []
    for row in rows:
        meta = row._meta
        objects.append(
            {
                field.column: field.get_prep_value(field.pre_save(row, add=True))
                for field in meta.concrete_fields
                if not field.primary_key
            }
        )
    return json.dumps(objects, cls=DjangoJSONEncoder)
