"""One place that turns errors into Baton's JSON error shape.

Every error response looks like
    {"detail": "<one readable sentence naming the field>", "code": "<code>",
     "fields": {"<field>": ["<problem>", ...]}}
`fields` is present when the problem is tied to input fields.
"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core.exceptions import RequestDataTooBig
from django.http import Http404
from rest_framework import exceptions, status
from rest_framework.response import Response
from rest_framework.views import exception_handler

from backend.errors import BatonError, Conflict, InvalidInput, NotFound, PayloadTooLarge

DOMAIN_STATUS = {
    InvalidInput: status.HTTP_400_BAD_REQUEST,
    NotFound: status.HTTP_404_NOT_FOUND,
    Conflict: status.HTTP_409_CONFLICT,
    PayloadTooLarge: status.HTTP_413_REQUEST_ENTITY_TOO_LARGE,
}


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
        body: dict[str, Any] = {"detail": exc.message, "code": exc.code}
        if exc.field:
            body["fields"] = {exc.field: [exc.message]}
        http_status = next(
            (code for kind, code in DOMAIN_STATUS.items() if isinstance(exc, kind)),
            status.HTTP_400_BAD_REQUEST,
        )
        return Response(body, status=http_status)

    if isinstance(exc, exceptions.ValidationError):
        fields = _flatten(exc.detail)
        if list(fields) == ["non_field_errors"] and any(
            "Expected a dictionary" in problem or problem == "No data provided"
            for problem in fields["non_field_errors"]
        ):
            return Response(
                {"detail": "The request body must be a JSON object.", "code": "invalid"},
                status=status.HTTP_400_BAD_REQUEST,
            )
        return Response(
            {"detail": _summary(fields), "code": "invalid", "fields": fields},
            status=status.HTTP_400_BAD_REQUEST,
        )

    if isinstance(exc, RequestDataTooBig):
        return Response(
            {
                "detail": "The request body is larger than this server accepts "
                f"({settings.BATON_MAX_REQUEST_BODY_BYTES} bytes).",
                "code": "too_large",
            },
            status=status.HTTP_413_REQUEST_ENTITY_TOO_LARGE,
        )

    if isinstance(exc, Http404):
        exc = exceptions.NotFound()
    response = exception_handler(exc, context)
    if response is not None and isinstance(exc, exceptions.APIException):
        detail = exc.detail if isinstance(exc.detail, str) else str(exc.detail)
        codes = exc.get_codes()
        response.data = {"detail": detail, "code": codes if isinstance(codes, str) else "error"}
    return response
