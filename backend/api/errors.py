"""One place that turns errors into Baton's JSON error shape.

Every error response looks like
    {"detail": "<one readable sentence naming the field>", "code": "<code>",
     "fields": {"<field>": ["<problem>", ...]}}
`fields` is present when the problem is tied to input fields.

Views never build error bodies themselves: they raise domain errors (`backend.errors`, and the
artifact errors of `backend.artifacts`) or let DRF raise its own, and `api_exception_handler`,
the only builder of the shape above, maps each by its type.
"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core.exceptions import RequestDataTooBig
from django.http import Http404
from rest_framework import exceptions, status
from rest_framework.response import Response
from rest_framework.views import exception_handler

from backend.artifacts.selectors import RangeNotSatisfiable
from backend.artifacts.storage import ArtifactIntegrityError
from backend.errors import (
    BatonError,
    Conflict,
    InvalidInput,
    NotFound,
    NotSatisfiable,
    PayloadTooLarge,
)

DOMAIN_STATUS = {
    InvalidInput: status.HTTP_400_BAD_REQUEST,
    NotFound: status.HTTP_404_NOT_FOUND,
    Conflict: status.HTTP_409_CONFLICT,
    PayloadTooLarge: status.HTTP_413_REQUEST_ENTITY_TOO_LARGE,
    NotSatisfiable: status.HTTP_416_REQUESTED_RANGE_NOT_SATISFIABLE,
}


class RequestBodyNotAnObject(exceptions.ParseError):
    """The request body parsed, but as JSON that is not an object (a list, a string, null)."""

    default_detail = "The request body must be a JSON object."
    default_code = "invalid"


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


def api_exception_handler(exc: Exception, context: dict[str, Any]) -> Response | None:
    if isinstance(exc, BatonError):
        http_status = next(
            (code for kind, code in DOMAIN_STATUS.items() if isinstance(exc, kind)),
            status.HTTP_400_BAD_REQUEST,
        )
        return error_response(
            http_status,
            detail=exc.message,
            code=exc.code,
            fields={exc.field: [exc.message]} if exc.field else None,
            headers=(
                {"Content-Range": f"bytes */{exc.size_bytes}"}
                if isinstance(exc, RangeNotSatisfiable)
                else None
            ),
        )

    if isinstance(exc, ArtifactIntegrityError):
        # Logged with the artifact id where it was found; no byte of content is sent.
        return error_response(status.HTTP_500_INTERNAL_SERVER_ERROR, detail=str(exc), code=exc.code)

    if isinstance(exc, exceptions.ValidationError):
        fields = _flatten(exc.detail)
        return error_response(
            status.HTTP_400_BAD_REQUEST, detail=_summary(fields), code="invalid", fields=fields
        )

    if isinstance(exc, RequestDataTooBig):
        return error_response(
            status.HTTP_413_REQUEST_ENTITY_TOO_LARGE,
            detail="The request body is larger than this server accepts "
            f"({settings.BATON_MAX_REQUEST_BODY_BYTES} bytes).",
            code="too_large",
        )

    if isinstance(exc, Http404):
        exc = exceptions.NotFound()
    response = exception_handler(exc, context)
    if response is not None and isinstance(exc, exceptions.APIException):
        detail = exc.detail if isinstance(exc.detail, str) else str(exc.detail)
        codes = exc.get_codes()
        response.data = error_body(detail=detail, code=codes if isinstance(codes, str) else "error")
    return response
