"""JSON rendering that cannot fail on text Python holds but UTF-8 cannot encode.

Responses are UTF-8 JSON. An error message may echo client input that carried a lone surrogate
(valid in JSON as an escape, invalid as UTF-8); rather than failing with a 500, such a response
is rendered with ASCII escapes, which any JSON client decodes to the same text.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from rest_framework.renderers import JSONRenderer


class BatonJSONRenderer(JSONRenderer):
    def render(
        self,
        data: Any,
        accepted_media_type: str | None = None,
        renderer_context: Mapping[str, Any] | None = None,
    ) -> bytes:
        try:
            rendered: bytes = super().render(data, accepted_media_type, renderer_context)
            return rendered
        except UnicodeEncodeError:
            return json.dumps(data, cls=self.encoder_class, ensure_ascii=True).encode("ascii")
