"""Each endpoint's request body limit, enforced before the body is read.

A view declares what its body may hold with a `body_limit` attribute (one of the `BodyLimit`s
below); a view that declares none — the small API bodies, the admin's forms, a view added
later — gets `DEFAULT`. `RequestBodyLimitMiddleware`, first in MIDDLEWARE, checks the limit of
the view the URL resolved to before any code reads the body:

- With `Content-Length`, a declared size over the limit is answered 413 at once: not a byte of
  the body is read. Under the limit, Django reads at most `Content-Length` bytes.
- Without it (`Transfer-Encoding: chunked`), the size is only known by reading: where the server
  hands the body over decoded and terminated (`wsgi.input_terminated`, as gunicorn does), it is
  read here, at most limit + 1 bytes, into a spool that keeps 1 MiB in memory and the rest on
  disk; one byte over the limit is 413. Where it does not (Django's development server), Django
  would see an empty body: 411, send `Content-Length`.

Under gunicorn every read of a body — chunked, or with `Content-Length`, read here or later by
a view — is guarded (`GuardedBody`): it waits at most BATON_REQUEST_BODY_TIMEOUT_SECONDS for
the next bytes (a socket timeout set for the read and restored after it, so answers are not
bound by it), and a body the server cannot decode is a 4xx, not a 500: a stall is 408
`body_timeout`, a malformed chunked encoding (a chunk size that is not hexadecimal, a chunk
without its CRLF) 400 `malformed_body`, a body the client cut off 400 `incomplete_body`.
gunicorn then closes the connection: where the next request would start is unknown.

Authentication comes after: the check needs no account, so a body too large for its endpoint is
413 for anyone. A body within the limit is not read before the view authenticates: DRF parses
`request.data` only when the handler asks for it, after authentication and permissions, so an
unauthenticated client gets 401 without the server reading its body (a chunked one excepted,
measured as above).

A limit is the size of the JSON of the largest valid request, with room for whitespace: JSON
may spell a character as a `\\uXXXX` escape (6 bytes for a 1-byte character) or a pair of them
(12 bytes for a 4-byte one), so text of N bytes of UTF-8 takes at most 6N bytes as a JSON
string, and a string of N characters at most 12N. What no service measures (progress events, a
result's keys beside its text) gets an allowance of its own, stated below: there the limit is
the rule. Limits are computed from the current settings at each request. A result value
uploaded on its own (`RESULT_VALUE`) is raw UTF-8, not JSON: its limit is the result limit
itself.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from io import BytesIO
from tempfile import SpooledTemporaryFile
from typing import Any, BinaryIO, cast

from django.conf import settings
from django.core.handlers.wsgi import LimitedStream
from django.http import HttpRequest, HttpResponse
from rest_framework import status
from rest_framework.exceptions import APIException

from backend.api.errors import is_api_request, json_error

KIB = 1024
MIB = 1024 * KIB

# The most bytes a JSON string takes per byte of UTF-8 in it (`\u0041` for "A").
JSON_BYTES_PER_UTF8_BYTE = 6

# Every field of a task or a follow-up but the message: title (200 chars), task type, sender
# and bot (64 chars each), executor, flags and the fields' names take under 6 KiB however they
# are escaped; the rest is room for whitespace.
OTHER_FIELDS_BYTES = 64 * KIB
# One pipeline step: a bot name (64 chars), an executor, a context passing mode and the three
# field names take under 1.2 KiB however they are escaped.
PIPELINE_STEP_BYTES = 2 * KIB
# Progress events have no size rule of their own: a post holds at most 1,000 of them, and the
# worker cuts an event's text to 4,000 chars (under 16 KiB as UTF-8 JSON).
PROGRESS_EVENTS_BYTES = 1000 * 16 * KIB
# Beside the text the result limit measures (a string `value`, the result's canonical JSON, or
# a failure's error): the result's other keys (commands, files changed), usage and ids.
RESULT_OTHER_FIELDS_BYTES = 1 * MIB
# An endpoint that declares no limit takes ids, names and flags (dispatch, heartbeats, policy
# changes) or an admin form, the largest of which — a bot's instructions, 32,000 chars at up to
# 12 bytes each percent-encoded — is under 400 KB.
DEFAULT_BODY_BYTES = 1 * MIB

# A chunked body is read in slices of this size, and kept in memory up to SPOOL_MEMORY_BYTES.
READ_CHUNK_BYTES = 64 * KIB
SPOOL_MEMORY_BYTES = 1 * MIB


class RequestBodyUnreadable(APIException):
    """The request body could not be read to its end (see the module docstring)."""

    status_code: int = status.HTTP_400_BAD_REQUEST


class BodyTimeout(RequestBodyUnreadable):
    status_code = status.HTTP_408_REQUEST_TIMEOUT
    default_code = "body_timeout"

    def __init__(self) -> None:
        timeout = settings.BATON_REQUEST_BODY_TIMEOUT_SECONDS
        super().__init__(
            f"The request body stalled: no bytes came for {timeout:g} seconds "
            "(BATON_REQUEST_BODY_TIMEOUT_SECONDS)."
        )


class MalformedBody(RequestBodyUnreadable):
    default_code = "malformed_body"
    default_detail = (
        "The request body's chunked encoding is malformed: each chunk is a hexadecimal size, "
        "CRLF, that many bytes and CRLF, and a chunk of size 0 ends the body."
    )


class IncompleteBody(RequestBodyUnreadable):
    default_code = "incomplete_body"
    default_detail = "The request body ended before its last chunk: the connection was cut."


class GuardedBody:
    """The server's `wsgi.input`, each read bounded by BATON_REQUEST_BODY_TIMEOUT_SECONDS of
    waiting (on `sock`, when the server names it) and its failures raised as
    `RequestBodyUnreadable`s. The server decodes chunked bodies itself: what its decoder
    raises, other than an OSError, is a body it could not decode."""

    def __init__(self, stream: Any, *, sock: Any) -> None:
        self._stream = stream
        self._sock = sock

    def read(self, size: int = -1) -> bytes:
        return self._guarded(self._stream.read, size)

    def readline(self, size: int = -1) -> bytes:
        return self._guarded(self._stream.readline, size)

    def _guarded(self, read: Callable[[int], bytes], size: int) -> bytes:
        prior = self._sock.gettimeout() if self._sock is not None else None
        if self._sock is not None:
            self._sock.settimeout(settings.BATON_REQUEST_BODY_TIMEOUT_SECONDS)
        try:
            return read(size)
        except TimeoutError:
            raise BodyTimeout() from None
        except OSError:  # the client went (gunicorn's NoMoreData is one)
            raise IncompleteBody() from None
        except Exception:  # noqa: BLE001 (the server's decoder refused the body)
            raise MalformedBody() from None
        finally:
            if self._sock is not None:
                self._sock.settimeout(prior)


def guard_body(request: HttpRequest) -> GuardedBody:
    """Read the request's body through a `GuardedBody` from here on; returns it."""
    body = GuardedBody(request.META["wsgi.input"], sock=request.META.get("gunicorn.socket"))
    stream = LimitedStream(cast(BytesIO, body), declared_length(request) or 0)
    request._stream = cast(BinaryIO, stream)
    return body


@dataclass(frozen=True)
class BodyLimit:
    """How many bytes an endpoint's request body may have.

    `size` computes it from the current settings. When one field's own size limit sets it,
    `field` names that field and `setting` the setting of its limit, for the 413 to name.
    """

    size: Callable[[], int]
    field: str | None = None
    setting: str | None = None

    def explanation(self) -> str:
        if self.field is None or self.setting is None:
            return ""
        limit = getattr(settings, self.setting)
        return f" ({self.field}: at most {limit} bytes of UTF-8, {self.setting})"


def _json_text_bytes(setting: str) -> int:
    return JSON_BYTES_PER_UTF8_BYTE * int(getattr(settings, setting))


def _new_task_bytes() -> int:
    return (
        _json_text_bytes("BATON_MAX_MESSAGE_BYTES")
        + OTHER_FIELDS_BYTES
        + settings.BATON_MAX_PIPELINE_STEPS * PIPELINE_STEP_BYTES
    )


def _follow_up_bytes() -> int:
    return _json_text_bytes("BATON_MAX_MESSAGE_BYTES") + OTHER_FIELDS_BYTES


def _progress_bytes() -> int:
    # partial_text is held to the message limit.
    return _json_text_bytes("BATON_MAX_MESSAGE_BYTES") + PROGRESS_EVENTS_BYTES + OTHER_FIELDS_BYTES


def _heartbeat_bytes() -> int:
    # The claims' ids (DEFAULT_BODY_BYTES) and the progress the heartbeat carries for them,
    # all its turns together within one progress post's limit: a worker sends the progress
    # that does not fit as a progress post of its own.
    return _progress_bytes() + DEFAULT_BODY_BYTES


def _result_bytes() -> int:
    return _json_text_bytes("BATON_MAX_RESULT_BYTES") + RESULT_OTHER_FIELDS_BYTES


NEW_TASK = BodyLimit(_new_task_bytes, field="message", setting="BATON_MAX_MESSAGE_BYTES")
FOLLOW_UP = BodyLimit(_follow_up_bytes, field="message", setting="BATON_MAX_MESSAGE_BYTES")
PROGRESS = BodyLimit(_progress_bytes, field="partial_text", setting="BATON_MAX_MESSAGE_BYTES")
HEARTBEAT = BodyLimit(_heartbeat_bytes)
RESULT = BodyLimit(_result_bytes, field="result", setting="BATON_MAX_RESULT_BYTES")
RESULT_VALUE = BodyLimit(
    lambda: int(settings.BATON_MAX_RESULT_BYTES), field="value", setting="BATON_MAX_RESULT_BYTES"
)
DEFAULT = BodyLimit(lambda: DEFAULT_BODY_BYTES)


def body_limit_of(view: Callable[..., Any]) -> BodyLimit:
    """The limit a view declares (`body_limit` on its class), else DEFAULT."""
    view_class = getattr(view, "view_class", None)  # class-based views, DRF's APIView included
    limit = getattr(view_class, "body_limit", DEFAULT)
    assert isinstance(limit, BodyLimit), f"{view_class}.body_limit is not a BodyLimit"
    return limit


def declared_length(request: HttpRequest) -> int | None:
    """The body's size as `Content-Length` declares it; None without the header. A value that
    is not a number counts as 0, as Django reads it."""
    value = request.META.get("CONTENT_LENGTH")
    if not value:
        return None
    try:
        return max(int(value), 0)
    except ValueError:
        return 0


def _read_at_most(stream: Any, limit: int) -> tuple[SpooledTemporaryFile[bytes], int] | None:
    """The stream's bytes in a spool and their count, or None when there are more than `limit`
    (reading stops at limit + 1)."""
    # Closed here when refused; otherwise it becomes the request's body, which Django closes
    # once it has read it.
    spool: SpooledTemporaryFile[bytes] = SpooledTemporaryFile(  # noqa: SIM115
        max_size=SPOOL_MEMORY_BYTES
    )
    size = 0
    while size <= limit:
        chunk = stream.read(min(READ_CHUNK_BYTES, limit + 1 - size))
        if not chunk:
            break
        spool.write(chunk)
        size += len(chunk)
    if size > limit:
        spool.close()
        return None
    spool.seek(0)
    return spool, size


def _refusal(
    request: HttpRequest, http_status: int, *, detail: str, code: str, field: str | None
) -> HttpResponse:
    """Baton's error body under /api/, the sentence as plain text elsewhere (the admin)."""
    if is_api_request(request):
        fields = {field: [detail]} if field else None
        return json_error(http_status, detail=detail, code=code, fields=fields)
    return HttpResponse(detail, status=http_status, content_type="text/plain; charset=utf-8")


class RequestBodyLimitMiddleware:
    """Refuses a request body over its view's `BodyLimit` before the body is read."""

    def __init__(self, get_response: Callable[[HttpRequest], Any]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> Any:
        return self.get_response(request)

    def process_view(
        self,
        request: HttpRequest,
        view: Callable[..., Any],
        view_args: tuple[Any, ...],
        view_kwargs: dict[str, Any],
    ) -> HttpResponse | None:
        body_limit = body_limit_of(view)
        limit = body_limit.size()
        endpoint = f"{request.method} {request.path}"
        declared = declared_length(request)
        body = guard_body(request)
        if declared is not None:
            if declared <= limit:
                return None
            return _refusal(
                request,
                status.HTTP_413_REQUEST_ENTITY_TOO_LARGE,
                detail=f"The request body is {declared} bytes; {endpoint} accepts at most "
                f"{limit} bytes{body_limit.explanation()}.",
                code="too_large",
                field=body_limit.field,
            )
        if "HTTP_TRANSFER_ENCODING" not in request.META:
            return None  # no body
        if not request.META.get("wsgi.input_terminated"):
            return _refusal(
                request,
                status.HTTP_411_LENGTH_REQUIRED,
                detail="This server cannot read a request body without Content-Length; "
                "send the header.",
                code="length_required",
                field=None,
            )
        try:
            spooled = _read_at_most(body, limit)
        except RequestBodyUnreadable as error:
            return _refusal(
                request,
                error.status_code,
                detail=str(error.detail),
                code=str(error.default_code),
                field=None,
            )
        if spooled is None:
            return _refusal(
                request,
                status.HTTP_413_REQUEST_ENTITY_TOO_LARGE,
                detail=f"The request body is larger than the {limit} bytes {endpoint} "
                f"accepts{body_limit.explanation()}.",
                code="too_large",
                field=body_limit.field,
            )
        # From here on the body is the spool, and its size is known: Django and DRF read it
        # as if it had come with Content-Length.
        spool, size = spooled
        request._stream = cast(BinaryIO, spool)
        request.META["CONTENT_LENGTH"] = str(size)
        return None
