"""The OpenAPI schema states every answer an operation gives, its errors included.

Each view declares its success answers, and the errors only it can give (a 409 of a turn in
the wrong state, a 503 of a store that failed), with `extend_schema`. The errors every view of
a kind gives are added here from what the view is, so no operation can forget one:

- 400 when the operation reads a body, query parameters or headers (each is validated);
- 401 when it needs an account, and 403 when its permissions can refuse one (or it changes
  something: a session without its CSRF token is refused too);
- 404 when the URL names something (the caller may not see it, or it does not exist) or a
  numbered page (past the last one);
- 413 and 415 when it reads a body: one over the endpoint's limit (`backend.api.body_limits`),
  or of a content type the endpoint does not parse.

Every error is Baton's one error body, the `ErrorOutput` component (`backend.api.errors`).
`BatonAutoSchema` is the schema class of every view (REST_FRAMEWORK's DEFAULT_SCHEMA_CLASS).
"""

from __future__ import annotations

from typing import Any

from drf_spectacular.openapi import AutoSchema
from drf_spectacular.utils import OpenApiResponse
from rest_framework.authentication import SessionAuthentication
from rest_framework.permissions import SAFE_METHODS, AllowAny, IsAuthenticated

from backend.api.errors import ErrorOutput

INVALID = "Invalid input: the error body names each field and its problem."
UNAUTHENTICATED = "No valid token (or session) was sent."
FORBIDDEN = "This account may not do this (or a session's CSRF token is missing)."
NOT_FOUND = "Nothing of that id for this account, or a page past the last one."
TOO_LARGE = "The request body is over this endpoint's limit (code `too_large`, naming it)."
UNSUPPORTED_MEDIA_TYPE = "The request body's content type is not one this endpoint reads."

# Permissions that refuse no authenticated account.
_ADMIT_ANY_ACCOUNT = (AllowAny, IsAuthenticated)


def error_response(description: str) -> OpenApiResponse:
    """An error answer a view declares itself (`extend_schema(responses=...)`)."""
    return OpenApiResponse(ErrorOutput, description=description)


# A write that stores text answers this when the artifact store fails (`ArtifactStorageError`).
STORE_FAILED = error_response(
    "The artifact store failed; nothing was recorded, and the same request may be retried."
)


class BatonAutoSchema(AutoSchema):
    def get_operation(self, *args: Any, **kwargs: Any) -> dict[str, Any] | None:
        operation: dict[str, Any] | None = super().get_operation(*args, **kwargs)
        if operation is None:
            return None
        responses: dict[str, Any] = operation["responses"]
        for status_code, description in self._implied_errors(operation):
            if str(status_code) not in responses:
                responses[str(status_code)] = self._error(status_code, description)
        operation["responses"] = dict(sorted(responses.items()))
        return operation

    def _error(self, status_code: int, description: str) -> dict[str, Any]:
        return self._get_response_for_code(  # type: ignore[no-untyped-call,no-any-return]
            error_response(description), str(status_code), ["application/json"]
        )

    def _implied_errors(self, operation: dict[str, Any]) -> list[tuple[int, str]]:
        reads_body = "requestBody" in operation
        locations = {parameter["in"]: parameter for parameter in operation.get("parameters", [])}
        query_names = {
            parameter["name"]
            for parameter in operation.get("parameters", [])
            if parameter["in"] == "query"
        }
        errors: list[tuple[int, str]] = []
        if reads_body or "query" in locations or "header" in locations:
            errors.append((400, INVALID))
        permissions = self.view.get_permissions()
        if any(not isinstance(permission, AllowAny) for permission in permissions):
            errors.append((401, UNAUTHENTICATED))
            unsafe = self.method not in SAFE_METHODS
            by_session = any(
                isinstance(authenticator, SessionAuthentication)
                for authenticator in self.view.get_authenticators()
            )
            if (unsafe and by_session) or any(
                not isinstance(permission, _ADMIT_ANY_ACCOUNT) for permission in permissions
            ):
                errors.append((403, FORBIDDEN))
        if "path" in locations or "page" in query_names:
            errors.append((404, NOT_FOUND))
        if reads_body:
            errors.append((413, TOO_LARGE))
            errors.append((415, UNSUPPORTED_MEDIA_TYPE))
        return errors
