"""The base of every input serializer: unknown fields and wrong JSON types are errors; and
the field for long texts."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from django.core.validators import ProhibitNullCharactersValidator
from rest_framework import serializers
from rest_framework.fields import empty
from rest_framework.settings import api_settings
from rest_framework.validators import ProhibitSurrogateCharactersValidator

from backend.api.errors import RequestBodyNotAnObject


class StrictInput(serializers.Serializer[Any]):
    """An input serializer that refuses fields it does not declare.

    Used as a whole request body (not nested), it refuses a body that is not a JSON object
    before looking at any field (`RequestBodyNotAnObject`).
    """

    def run_validation(self, data: Any = empty) -> Any:
        if self.parent is None and not isinstance(data, Mapping):
            raise RequestBodyNotAnObject()
        return super().run_validation(data)

    # A JSON body's values must already have their field's type: "5" is not an integer, 5 is
    # not a string and "yes" is not a boolean (DRF would coerce them silently).
    strict_types = True

    def to_internal_value(self, data: Any) -> Any:
        if isinstance(data, dict):
            unknown = sorted(set(data) - set(self.fields))
            if unknown:
                raise serializers.ValidationError({name: ["Unknown field."] for name in unknown})
            if self.strict_types:
                wrong = {
                    name: [problem]
                    for name, value in data.items()
                    if (problem := _wrong_json_type(self.fields[name], value)) is not None
                }
                if wrong:
                    raise serializers.ValidationError(wrong)
        return super().to_internal_value(data)


def _wrong_json_type(field: serializers.Field[Any, Any, Any, Any], value: Any) -> str | None:
    """What is wrong with `value`'s JSON type for `field`, if anything (null is the field's
    own business: allow_null)."""
    if value is None:
        return None
    if isinstance(field, serializers.BooleanField) and not isinstance(value, bool):
        return "Must be true or false."
    if isinstance(field, serializers.IntegerField) and (
        not isinstance(value, int) or isinstance(value, bool)
    ):
        return "Must be an integer."
    if isinstance(field, serializers.FloatField) and (
        not isinstance(value, int | float) or isinstance(value, bool)
    ):
        return "Must be a number."
    if isinstance(field, serializers.CharField | serializers.ChoiceField) and not isinstance(
        value, str
    ):
        return "Must be a string."
    return None


class StrictQuery(StrictInput):
    """Query parameters: undeclared ones are refused, except DRF's own `?format=` override.

    The browsable API links every page to `?format=json` and `?format=api`; the renderer reads
    that parameter, so it is not a filter and must not be refused as one. Query values are
    strings by nature, so their types are the fields' to parse.
    """

    strict_types = False

    def to_internal_value(self, data: Any) -> Any:
        if isinstance(data, dict):
            data = {k: v for k, v in data.items() if k != api_settings.URL_FORMAT_OVERRIDE}
        return super().to_internal_value(data)


# The largest id a row can have (BigAutoField, a signed 64-bit integer): a larger one names no
# row, and the database could not even compare it.
MAX_ROW_ID = 2**63 - 1
# The largest attempt number a turn can have (`Subtask.attempts`, a PositiveIntegerField).
MAX_ATTEMPT = 2**31 - 1


def row_id_field(**kwargs: Any) -> serializers.IntegerField:
    """A row's id in a request body: a 400 naming the field past MAX_ROW_ID, not a 500."""
    return serializers.IntegerField(min_value=1, max_value=MAX_ROW_ID, **kwargs)


def attempt_field(**kwargs: Any) -> serializers.IntegerField:
    return serializers.IntegerField(min_value=1, max_value=MAX_ATTEMPT, **kwargs)


_SURROGATE = re.compile("[\ud800-\udfff]")


class TextField(serializers.CharField):
    """A CharField for texts that may be long (a message, a partial answer): DRF's check that
    no lone surrogate is in it, with DRF's error, done by one regular-expression search, where
    DRF looks at every character in Python. A progress post in process, Python CPU: 8.45–8.85
    ms with DRF's check and 5.71–6.31 ms with this one at a 100 KB partial text, 4.59–5.17
    against 4.01–4.30 ms at 20 KB, the same at 2 KB (two runs each, alternated)."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.validators = [
            validator
            for validator in self.validators
            if not isinstance(validator, ProhibitSurrogateCharactersValidator)
        ] + [_no_lone_surrogate]


def _no_lone_surrogate(value: str) -> None:
    found = _SURROGATE.search(value)
    if found is not None:
        message = ProhibitSurrogateCharactersValidator.message.format(code_point=ord(found[0]))
        raise serializers.ValidationError(message, code=ProhibitSurrogateCharactersValidator.code)


class ExecutorTextField(TextField):
    """A text an executor emitted (its partial answer): NUL and lone surrogates are taken, as in
    a result, since binary tool output and a cut emoji are what an agent may legitimately
    stream. The service stores them as U+FFFD (`ingestion.replace_unstorable_chars`), one code
    point for one, so lengths and offsets stay the worker's."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.validators = [
            validator
            for validator in self.validators
            if not isinstance(validator, ProhibitNullCharactersValidator)
            and validator is not _no_lone_surrogate
        ]
