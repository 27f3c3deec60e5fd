"""One place that turns errors into Baton's JSON error shape.

Every error response looks like
    {"detail": "<one readable sentence naming the field>", "code": "<code>",
     "fields": {"<field>": ["<problem>", ...]}}
`fields` is present when the problem is tied to input fields.

Views never build error bodies themselves: they raise domain errors (`backend.errors`, and the
artifact errors of `backend.artifacts`) or let DRF raise its own, and `api_exception_handler`,
the only builder of the shape above, maps each by its type.

Errors that DRF does not answer get the same body under /api/: Django's error views
(`handler400`, `handler404` and `handler500` in `backend/urls.py`) answer a Host header that is
not in ALLOWED_HOSTS with 400 `bad_request`, a URL no endpoint matches with 404 `not_found` and
an unhandled exception with 500 `server_error` there, and with Django's own HTML pages
everywhere else (the admin). A request that found every connection of its process's database
pool in use for BATON_DATABASE_POOL_TIMEOUT_SECONDS is answered 503 `busy` with Retry-After,
in a view or before one. A 500 says nothing of the exception, and is logged as an event
with the exception's type only: its text may quote a message or a result (principle 7). A
request body over its endpoint's limit is refused before any view runs, with 413 `too_large`
naming the limit (`backend.api.body_limits`, through `json_error`). With DEBUG (`make run`)
Django answers those two with its HTML debug pages instead of the error views;
`ApiErrorsMiddleware` gives /api/ the same JSON bodies there, so development answers as
production does.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable
from typing import Any

from django.conf import settings
from django.core.exceptions import BadRequest, DisallowedHost, PermissionDenied
from django.http import Http404, HttpRequest, HttpResponse
from django.views import defaults
from psycopg_pool import PoolTimeout
from rest_framework import exceptions, serializers, status
from rest_framework.response import Response
from rest_framework.views import exception_handler

from backend.api.renderers import BatonJSONRenderer
from backend.artifacts.selectors import RangeNotSatisfiable
from backend.artifacts.storage import ArtifactIntegrityError, ArtifactStorageError
from backend.errors import (
    BatonError,
    Busy,
    Conflict,
    InvalidInput,
    NotFound,
    NotSatisfiable,
    PartialTextMismatch,
    PayloadTooLarge,
)
from backend.events import log_event, opaque_id

API_PATH_PREFIX = "/api/"
# What a client waits before it retries a request the database pool had no connection for.
POOL_RETRY_AFTER_SECONDS = 1

DOMAIN_STATUS = {
    InvalidInput: status.HTTP_400_BAD_REQUEST,
    NotFound: status.HTTP_404_NOT_FOUND,
    Conflict: status.HTTP_409_CONFLICT,
    PayloadTooLarge: status.HTTP_413_REQUEST_ENTITY_TOO_LARGE,
    NotSatisfiable: status.HTTP_416_REQUESTED_RANGE_NOT_SATISFIABLE,
    Busy: status.HTTP_503_SERVICE_UNAVAILABLE,
}


class RequestBodyNotAnObject(exceptions.ParseError):
    """The request body parsed, but as JSON that is not an object (a list, a string, null)."""

    default_detail = "The request body must be a JSON object."
    default_code = "invalid"


class PathHoldsNul(BadRequest):
    """A name or id in the URL's path holds a NUL character (`backend.api.urls`): 400."""

    detail = "The URL's path holds a NUL character, which no id or name can contain."


class ErrorOutput(serializers.Serializer[dict[str, Any]]):
    """Baton's error body, as the OpenAPI schema names it (every operation's error answers)."""

    detail = serializers.CharField()
    code = serializers.CharField()
    # The stubs see Serializer.fields here; the serializer's metaclass takes declared fields off
    # the class, so the property stays intact and the body gets a "fields" key.
    fields = serializers.DictField(  # type: ignore[assignment]
        child=serializers.ListField(child=serializers.CharField()), required=False
    )


def error_body(
    *, detail: str, code: str, fields: dict[str, list[str]] | None = None
) -> dict[str, Any]:
    """Baton's error body (see the module docstring)."""
    body: dict[str, Any] = {"detail": detail, "code": code}
    if fields:
        body["fields"] = fields
    return body


def error_response(
    http_status: int,
    *,
    detail: str,
    code: str,
    fields: dict[str, list[str]] | None = None,
    headers: dict[str, str] | None = None,
) -> Response:
    return Response(
        error_body(detail=detail, code=code, fields=fields), status=http_status, headers=headers
    )


def _flatten(detail: Any, prefix: str = "") -> dict[str, list[str]]:
    """Flatten DRF's nested error detail into {"pipeline.0.executor": ["..."]}."""
    if isinstance(detail, dict):
        flat: dict[str, list[str]] = {}
        for key, value in detail.items():
            if key == "non_field_errors" and prefix:
                name = prefix  # an error about the nested object itself
            else:
                name = f"{prefix}.{key}" if prefix else str(key)
            flat.update(_flatten(value, name))
        return flat
    if isinstance(detail, list):
        if all(not isinstance(item, (dict, list)) for item in detail):
            return {prefix or "non_field_errors": [str(item) for item in detail]}
        flat = {}
        for index, value in enumerate(detail):
            if value:
                flat.update(_flatten(value, f"{prefix}.{index}" if prefix else str(index)))
        return flat
    return {prefix or "non_field_errors": [str(detail)]}


def _summary(fields: dict[str, list[str]]) -> str:
    parts = []
    for name, problems in fields.items():
        text = " ".join(problems)
        parts.append(text if name == "non_field_errors" else f"{name}: {text}")
    return "Invalid input. " + " ".join(parts)


def invalid_input_detail(detail: Any, *, prefix: str) -> str:
    """What a 400 `invalid` body's `detail` would say of DRF's error `detail`, its fields named
    under `prefix`: for a part of a request refused on its own (a claim's progress in a
    batched heartbeat)."""
    return _summary(_flatten(detail, prefix))


def _error_headers(exc: BatonError) -> dict[str, str] | None:
    if isinstance(exc, RangeNotSatisfiable):
        return {"Content-Range": f"bytes */{exc.size_bytes}"}
    if isinstance(exc, Busy):
        return {"Retry-After": str(exc.retry_after_seconds)}
    return None


def pool_exhausted(exc: BaseException | None) -> bool:
    """Whether `exc` is a wait for a pooled connection that timed out: psycopg's PoolTimeout,
    as Django raises it (an OperationalError caused by it)."""
    while exc is not None:
        if isinstance(exc, PoolTimeout):
            return True
        exc = exc.__cause__
    return False


def _database_busy() -> Busy:
    log_event("database_pool_exhausted", level=logging.WARNING)
    return Busy(
        "Every database connection of this server process is in use; retry in a second.",
        retry_after_seconds=POOL_RETRY_AFTER_SECONDS,
    )


def api_exception_handler(exc: Exception, context: dict[str, Any]) -> Response | None:
    if pool_exhausted(exc):
        exc = _database_busy()
    if isinstance(exc, BatonError):
        http_status = next(
            (code for kind, code in DOMAIN_STATUS.items() if isinstance(exc, kind)),
            status.HTTP_400_BAD_REQUEST,
        )
        answer = error_response(
            http_status,
            detail=exc.message,
            code=exc.code,
            fields={exc.field: [exc.message]} if exc.field else None,
            headers=_error_headers(exc),
        )
        if isinstance(exc, PartialTextMismatch):
            # What the worker needs to know: how long the stored partial text is.
            answer.data["partial_text_chars"] = exc.stored_chars
        return answer

    if isinstance(exc, ArtifactIntegrityError):
        # Logged with the artifact id where it was found; no byte of content is sent.
        return error_response(status.HTTP_500_INTERNAL_SERVER_ERROR, detail=str(exc), code=exc.code)

    if isinstance(exc, ArtifactStorageError):
        # Nothing was recorded and nothing is left of the write: the same request can be
        # retried (workers retry a 503 on their own). Logged as `artifact_write_failed`.
        return error_response(status.HTTP_503_SERVICE_UNAVAILABLE, detail=str(exc), code=exc.code)

    if isinstance(exc, exceptions.ValidationError):
        fields = _flatten(exc.detail)
        return error_response(
            status.HTTP_400_BAD_REQUEST, detail=_summary(fields), code="invalid", fields=fields
        )

    if isinstance(exc, Http404):
        exc = exceptions.NotFound()
    response = exception_handler(exc, context)
    if response is not None and isinstance(exc, exceptions.APIException):
        detail = exc.detail if isinstance(exc.detail, str) else str(exc.detail)
        codes = exc.get_codes()
        response.data = error_body(detail=detail, code=codes if isinstance(codes, str) else "error")
    return response


# --- Django's error views (backend/urls.py) ---------------------------------------------------


def is_api_request(request: HttpRequest) -> bool:
    path = request.path_info
    return path.startswith(API_PATH_PREFIX) or path == API_PATH_PREFIX.rstrip("/")


def json_error(
    http_status: int, *, detail: str, code: str, fields: dict[str, list[str]] | None = None
) -> HttpResponse:
    """Baton's error body outside DRF, rendered as DRF renders it."""
    return HttpResponse(
        BatonJSONRenderer().render(error_body(detail=detail, code=code, fields=fields)),
        status=http_status,
        content_type="application/json",
    )


def bad_request(request: HttpRequest, exception: Exception) -> HttpResponse:
    if not is_api_request(request):
        return defaults.bad_request(request, exception)
    if isinstance(exception, DisallowedHost):
        # Django logs the refused host on django.security.DisallowedHost.
        detail = "The request's Host header names a host this server does not serve."
    elif isinstance(exception, PathHoldsNul):
        detail = exception.detail
    else:
        detail = "The request is malformed."
    return json_error(status.HTTP_400_BAD_REQUEST, detail=detail, code="bad_request")


def page_not_found(request: HttpRequest, exception: Exception) -> HttpResponse:
    if not is_api_request(request):
        return defaults.page_not_found(request, exception)
    return json_error(
        status.HTTP_404_NOT_FOUND, detail="No API endpoint matches this URL.", code="not_found"
    )


def server_error(request: HttpRequest) -> HttpResponse:
    """An unhandled exception (Django calls this inside its `except` block)."""
    if not is_api_request(request):
        return defaults.server_error(request)
    error = sys.exc_info()[1]
    if pool_exhausted(error):  # before any view, in a middleware's query
        busy = _database_busy()
        response = json_error(
            status.HTTP_503_SERVICE_UNAVAILABLE, detail=busy.message, code=busy.code
        )
        response["Retry-After"] = str(busy.retry_after_seconds)
        response._has_been_logged = True  # type: ignore[attr-defined]
        return response
    match = request.resolver_match
    log_event(
        "request_failed",
        level=logging.ERROR,
        status=status.HTTP_500_INTERNAL_SERVER_ERROR,
        method=opaque_id(request.method or ""),
        view=opaque_id(match.url_name or "") if match is not None else None,
        error_type=opaque_id(type(error).__name__) if error is not None else None,
    )
    response = json_error(
        status.HTTP_500_INTERNAL_SERVER_ERROR,
        detail="The server failed to handle this request. The failure has been logged.",
        code="server_error",
    )
    # Logged above. Django would log the exception again on django.request with its text and
    # traceback, which may quote content; a response marked as logged is not logged again.
    response._has_been_logged = True  # type: ignore[attr-defined]
    return response


class ApiErrorsMiddleware:
    """Under /api/, Baton's JSON error body with DEBUG too. With DEBUG, Django answers a URL no
    endpoint matches and an unhandled exception with its HTML debug pages (the second quotes
    the exception and the request), and never calls the error views above; this answers them
    as those views do. Without DEBUG it changes nothing."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        response = self.get_response(request)
        if (
            settings.DEBUG
            and response.status_code == status.HTTP_404_NOT_FOUND
            and is_api_request(request)
            and response.get("Content-Type", "").startswith("text/html")
        ):
            return page_not_found(request, Http404())
        return response

    def process_exception(self, request: HttpRequest, exception: Exception) -> HttpResponse | None:
        # Django's own answers to these (404, 403, 400) go through the views above.
        handled = (Http404, PermissionDenied, BadRequest, DisallowedHost)
        if not settings.DEBUG or isinstance(exception, handled) or not is_api_request(request):
            return None
        return server_error(request)
