"""The API's JSON parser: DRF's, with a bound on how deeply a request body may nest.

Python's JSON decoder, its encoder and everything that walks a decoded value (serializers, the
lossless JSON field, equality checks) recurse once per level, so a body nested about a thousand
levels deep would end in a RecursionError, a 500, somewhere after it was accepted. So a body
nested more than `MAX_JSON_DEPTH` levels (the body's own object or list is level 1), far more
than a task, a report or a result needs, is refused where it is parsed, with 400 `parse_error`,
and every value a view sees is at most that deep.

The check costs nothing for most bodies: one that holds at most `MAX_JSON_DEPTH` `[` and `{` in
all, strings included, cannot nest deeper. Otherwise the parsed value is measured level by
level, iteratively (`nested_deeper_than`). A body deep enough to exhaust the decoder's own
recursion budget never gets that far: the decoder checks the budget before each level, in C,
and its RecursionError is reported as the same 400.
"""

from __future__ import annotations

from collections.abc import Mapping
from itertools import chain, compress
from typing import IO, Any

from django.conf import settings
from rest_framework.exceptions import ParseError
from rest_framework.parsers import JSONParser
from rest_framework.utils import json

# Ruby's JSON parser refuses more than 100 levels by default, serde_json 128. Far below Python's
# recursion limit (1,000), with room for a request's own stack (under 100 frames) on top.
MAX_JSON_DEPTH = 100

_CONTAINERS = frozenset({dict, list})


# This module must not import rest_framework.views (nor backend.api.errors, which does): DRF
# reads DEFAULT_PARSER_CLASSES while it defines APIView, and would import this module halfway.
class RequestBodyTooDeep(ParseError):
    """The body nests lists and objects more than `MAX_JSON_DEPTH` levels deep (400
    `parse_error`, like any body that cannot be parsed)."""

    def __init__(self) -> None:
        super().__init__(
            f"The request body is nested too deeply (more than {MAX_JSON_DEPTH} levels)."
        )


def nested_deeper_than(value: Any, limit: int) -> bool:
    """Whether `value` nests dicts and lists more than `limit` levels (a dict or list is level
    1, a scalar level 0). Walks one level at a time, without recursion. Only values of type
    dict and list are followed, which is all a JSON decoder builds."""
    is_container = _CONTAINERS.__contains__
    level = [value] if type(value) in _CONTAINERS else []
    depth = 0
    while level:
        depth += 1
        if depth > limit:
            return True
        # The next level: each child of this level that is a dict or a list. A body may hold
        # millions of values, so the types are checked in C (map, compress), not in a loop.
        children = list(
            chain.from_iterable(node.values() if type(node) is dict else node for node in level)
        )
        level = list(compress(children, map(is_container, map(type, children))))
    return False


def _charset(parser_context: Mapping[str, Any]) -> str:
    """The charset the body is decoded with: the Content-Type's, else DEFAULT_CHARSET. Only
    text encodings: a codec such as `bz2_codec` would expand a small body without bound."""
    encoding: str = parser_context.get("encoding") or settings.DEFAULT_CHARSET
    try:
        "".encode(encoding)
    except (LookupError, UnicodeError):
        raise ParseError(
            f'Unsupported charset "{encoding}" in request Content-Type header.'
        ) from None
    return encoding


class BatonJSONParser(JSONParser):
    """DRF's JSONParser, refusing a body nested more than `MAX_JSON_DEPTH` levels deep."""

    def parse(
        self,
        stream: IO[Any],
        media_type: str | None = None,
        parser_context: Mapping[str, Any] | None = None,
    ) -> Any:
        encoding = _charset(parser_context or {})
        parse_constant = json.strict_constant if self.strict else None
        try:
            text = stream.read().decode(encoding)
            data = json.loads(text, parse_constant=parse_constant)
        except RecursionError:
            # The decoder refused to go deeper: it checks its budget before each level.
            raise RequestBodyTooDeep() from None
        except ValueError as exc:
            raise ParseError(f"JSON parse error - {exc}") from None
        openers = text.count("[") + text.count("{")
        if openers > MAX_JSON_DEPTH and nested_deeper_than(data, MAX_JSON_DEPTH):
            raise RequestBodyTooDeep()
        return data
