"""Domain errors raised by Baton's services and selectors.

Services speak in these terms; one API exception handler (`backend.api.errors`) maps each class
to its HTTP status. Every error names the field or the object it is about, so a client can tell
what to fix without reading server logs.
"""

from __future__ import annotations


class BatonError(Exception):
    """Base class: a request Baton understood but cannot carry out as asked."""

    code = "error"

    def __init__(self, message: str, *, field: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.field = field


class InvalidInput(BatonError):
    """The input breaks a domain rule (400)."""

    code = "invalid"


class NotFound(BatonError):
    """The object does not exist or the caller may not see it (404)."""

    code = "not_found"


class Conflict(BatonError):
    """The object's current state does not allow the operation (409)."""

    code = "conflict"


class PayloadTooLarge(BatonError):
    """A message or result is above the configured hard limit (413)."""

    code = "too_large"


class NotSatisfiable(BatonError):
    """A requested slice (a byte range, a line range) lies outside the content (416)."""

    code = "not_satisfiable"


class Busy(BatonError):
    """The server has no room for this request now; retry after `retry_after_seconds` (503)."""

    code = "busy"

    def __init__(self, message: str, *, retry_after_seconds: int) -> None:
        super().__init__(message)
        self.retry_after_seconds = retry_after_seconds


class TurnCancelled(Conflict):
    """The turn a worker holds was cancelled by the product: stop the executor (409)."""

    code = "cancelled"


class LeaseLost(Conflict):
    """The worker's claim on a turn is gone (expired and reclaimed, or finished) (409)."""

    code = "lease_lost"


class UploadMissing(Conflict):
    """A report names a value upload Baton does not hold whole (removed since, or its stored
    copy damaged): upload the value again, then report (409)."""

    code = "upload_missing"


class PartialTextMismatch(Conflict):
    """A progress post's `partial_text_offset` is not the stored partial text's length: the
    worker lost track of what Baton holds. It sends the whole text then (409)."""

    code = "partial_text_mismatch"

    def __init__(self, message: str, *, stored_chars: int) -> None:
        super().__init__(message, field="partial_text_offset")
        self.stored_chars = stored_chars
