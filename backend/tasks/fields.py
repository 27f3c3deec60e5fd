"""A JSON model field that stores exactly what the client sent, on every database.

PostgreSQL's jsonb refuses two things JSON itself allows: the escape `\\u0000` and lone UTF-16
surrogates (`"\\ud800"`). An executor's result may carry either (binary tool output, cut
emoji), and Baton promises never to lose or alter a stored result. So results are kept as JSON
text: compact, UTF-8, with lone surrogates written as `\\uXXXX` escapes that `json.loads` turns
back into the same Python string.
"""

from __future__ import annotations

import json
import re
from typing import Any

from django.db import models

# A lone surrogate: valid in a Python str and as a JSON escape, not encodable as UTF-8.
LONE_SURROGATE = re.compile("[\ud800-\udfff]")


def dump_lossless_json(value: Any) -> str:
    text = json.dumps(value, ensure_ascii=False, separators=(",", ":"))
    if LONE_SURROGATE.search(text) is None:
        return text
    # Outside strings JSON text is ASCII, so every surrogate here is inside a string literal,
    # where its escape means the same code point.
    return LONE_SURROGATE.sub(lambda match: f"\\u{ord(match.group()):04x}", text)


class LosslessJSONField(models.TextField[Any, Any]):
    description = "JSON stored losslessly as text"

    def from_db_value(self, value: str | None, expression: Any, connection: Any) -> Any:
        if value is None:
            return None
        return json.loads(value)

    def to_python(self, value: Any) -> Any:
        return value

    def get_prep_value(self, value: Any) -> str | None:
        if value is None:
            return None
        return dump_lossless_json(value)

    def value_to_string(self, obj: models.Model) -> str:
        return dump_lossless_json(self.value_from_object(obj))
