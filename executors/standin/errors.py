"""HTTP error answers in each provider's own body shape.

Executors classify failures from what the provider sends, so the stand-in's errors copy the real
shapes: OpenAI ``{"error": {"message", "type", "code", "param"}}`` and Anthropic
``{"type": "error", "error": {"type", "message"}}``. The context-length errors use the texts the
real APIs send, because Baton's error classifier is written from what executors print for them.
"""

from __future__ import annotations

from typing import Any

from executors.standin.script import HttpError, Turn
from executors.standin.wire import JsonReply

# The real OpenAI Responses API text for an input over the model's window (code
# context_length_exceeded); Chat Completions words it differently.
RESPONSES_CONTEXT_MESSAGE = (
    "Your input exceeds the context window of this model. Please adjust your input and try again."
)
CHAT_CONTEXT_MESSAGE = (
    "This model's maximum context length is 200000 tokens. However, your messages resulted in "
    "250000 tokens. Please reduce the length of the messages."
)
ANTHROPIC_CONTEXT_MESSAGE = "prompt is too long: 250000 tokens > 200000 maximum"

_OPENAI_TYPES = {
    400: "invalid_request_error",
    401: "invalid_request_error",
    403: "permission_error",
    404: "invalid_request_error",
    429: "requests",
}
_OPENAI_CODES = {401: "invalid_api_key", 429: "rate_limit_exceeded"}
_ANTHROPIC_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    500: "api_error",
    529: "overloaded_error",
}
_DEFAULT_MESSAGES = {
    400: "Invalid request.",
    401: "Incorrect API key provided.",
    403: "You are not allowed to use this model.",
    404: "Not found.",
    429: "Rate limit reached. Please try again in 1s.",
    529: "Overloaded",
}


def _default_message(status: int) -> str:
    if status in _DEFAULT_MESSAGES:
        return _DEFAULT_MESSAGES[status]
    return "The server had an error while processing your request." if status >= 500 else "Error."


def openai_error(
    status: int,
    message: str,
    error_type: str = "",
    code: str | None = None,
    param: str | None = None,
) -> dict[str, Any]:
    kind = error_type or _OPENAI_TYPES.get(
        status, "server_error" if status >= 500 else "invalid_request_error"
    )
    return {
        "error": {
            "message": message or _default_message(status),
            "type": kind,
            "code": code if code is not None else _OPENAI_CODES.get(status),
            "param": param,
        }
    }


def anthropic_error(status: int, message: str, error_type: str = "") -> dict[str, Any]:
    kind = error_type or _ANTHROPIC_TYPES.get(
        status, "api_error" if status >= 500 else "invalid_request_error"
    )
    return {
        "type": "error",
        "error": {"type": kind, "message": message or _default_message(status)},
    }


def context_overflow_error(api: str) -> HttpError:
    """The error each real API sends for a prompt over the model's context window."""
    if api == "messages":
        return HttpError(400, ANTHROPIC_CONTEXT_MESSAGE, "invalid_request_error")
    if api == "responses":
        return HttpError(
            400,
            RESPONSES_CONTEXT_MESSAGE,
            "invalid_request_error",
            "context_length_exceeded",
            "input",
        )
    return HttpError(
        400, CHAT_CONTEXT_MESSAGE, "invalid_request_error", "context_length_exceeded", "messages"
    )


def _as_http_error(api: str, turn: Turn) -> HttpError:
    if turn.context_overflow:
        return context_overflow_error(api)
    if turn.http_error is not None:
        return turn.http_error
    # A `fail` turn outside a Responses stream: the provider broke with a server error.
    return HttpError(500, turn.fail or "", "", turn.fail_code)


def error_reply(api: str, turn: Turn) -> JsonReply:
    """The HTTP error that answers a failing ``turn`` on ``api``."""
    error = _as_http_error(api, turn)
    if api == "messages":
        body = anthropic_error(error.status, error.message, error.error_type)
    else:
        body = openai_error(error.status, error.message, error.error_type, error.code, error.param)
    headers = {"retry-after": "1"} if error.status == 429 else {}
    return JsonReply(error.status, body, headers)
