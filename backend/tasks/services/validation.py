"""The checks a request's text, sender and follow-up strategy pass before anything is stored.

Creating a task, sending a follow-up and recording a result share them, so each refusal names
its field the same way wherever it comes from.
"""

from __future__ import annotations

from django.conf import settings

from backend.errors import InvalidInput, PayloadTooLarge
from backend.prompting.inputs import validate_name
from backend.tasks.fields import LONE_SURROGATE
from backend.tasks.models import (
    FollowUpStrategy,
)


def check_text_size(*, text: str, limit: int, field: str) -> None:
    """PayloadTooLarge naming `field` when `text` is over `limit` bytes of UTF-8.

    Measures in 1 MiB slices, so a 50 MB result is never encoded as a whole copy; text that
    cannot reach the limit (4 bytes per code point at most) is not encoded at all.
    """
    if len(text) * 4 <= limit:
        return
    size = 0
    for start in range(0, len(text), 1 << 20):
        size += len(text[start : start + (1 << 20)].encode("utf-8", "surrogatepass"))
    if size > limit:
        raise PayloadTooLarge(
            f"{field} is {size} bytes of UTF-8; the limit is {limit} bytes.", field=field
        )


def validate_message_text(*, text: str, field: str = "message") -> None:
    """Reject text Baton cannot store losslessly or that is above the hard size limit."""
    if not text.strip():
        raise InvalidInput(f"{field} must not be empty.", field=field)
    if "\x00" in text:
        raise InvalidInput(f"{field} must not contain NUL characters.", field=field)
    surrogate = LONE_SURROGATE.search(text)
    if surrogate is not None:
        raise InvalidInput(
            f"{field} is not valid Unicode (lone surrogate at position {surrogate.start()}).",
            field=field,
        )
    check_text_size(text=text, limit=settings.BATON_MAX_MESSAGE_BYTES, field=field)


def _validate_label_name(*, value: str, field: str) -> None:
    """Sender and bot names appear inside prompt role labels (`User[alice]:`)."""
    try:
        validate_name(value)
    except ValueError as error:
        raise InvalidInput(f"{field} {error}.", field=field) from None


def _validate_sender(*, is_group_chat: bool, sender: str) -> None:
    if is_group_chat and not sender.strip():
        raise InvalidInput("sender is required in a group-chat task.", field="sender")
    if sender:
        _validate_label_name(value=sender, field="sender")


def _validate_strategy(value: str, *, field: str, allow_empty: bool = False) -> None:
    if value not in FollowUpStrategy.values and not (allow_empty and value == ""):
        raise InvalidInput(
            f"{field} must be one of {', '.join(FollowUpStrategy.values)}.", field=field
        )
