"""The OpenAPI schema's endpoint: drf-spectacular's view, generating one schema at a time.

drf-spectacular's generator keeps process-wide state while it runs (`GENERATOR_STATS`, the view
each operation is read from), which two threads generating at once corrupt: a fresh server
process asked for the schema by two requests at once answered 500 (an `AttributeError`; the
library's issues #1368 and #1123). Generating takes a moment and the schema is asked for
rarely (the API docs, a client's code generator), so requests take turns.
"""

from __future__ import annotations

import threading

from drf_spectacular.views import SpectacularAPIView
from rest_framework.request import Request
from rest_framework.response import Response

_GENERATING = threading.Lock()


class SchemaApi(SpectacularAPIView):
    def _get_schema_response(self, request: Request) -> Response:
        with _GENERATING:
            response: Response = super()._get_schema_response(request)  # type: ignore[no-untyped-call]
            return response
