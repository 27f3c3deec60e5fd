"""Scripted turns: what the model answers to each model call, checked once when the script is set.

A script is a list of plain dicts (tests write them inline, `POST /_script` sends them as JSON).
:func:`parse_turns` turns each into a frozen :class:`Turn`, rejecting unknown keys and impossible
combinations at once, so that a typo in a test fails where it was written instead of as a strange
executor error later. The wire modules render a `Turn` for their API; nothing here knows a wire.

Turn shapes (every turn may also carry ``delay_seconds`` and ``usage``)::

    {"text": "..."}                                      final assistant text
    {"tool": {"name": "...", "arguments": {...}}}        a function / tool call ("text" optional)
    {"custom_tool": {"name": "...", "input": "..."}}     a freeform tool call (Codex apply_patch)
    {"reasoning": "...", "text": "..."}                  reasoning before the answer
    {"fail": "message", "code": "..."?}                  Responses: response.failed; else HTTP 500
    {"http_status": N, "message": "...", "code"?, "type"?}   an HTTP error in the API's shape
    {"context_overflow": true}                           the API's real context-length error
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

DEFAULT_INPUT_TOKENS = 11
DEFAULT_OUTPUT_TOKENS = 7


class ScriptError(ValueError):
    """A scripted turn has a shape the stand-in cannot answer with."""


@dataclass(frozen=True)
class TurnUsage:
    """Token usage reported for one successful answer; OpenAI's meaning of each number.

    ``input_tokens`` includes ``cached_input_tokens`` and ``output_tokens`` includes
    ``reasoning_tokens``, as in OpenAI usage; the Anthropic wire converts.
    """

    input_tokens: int = DEFAULT_INPUT_TOKENS
    output_tokens: int = DEFAULT_OUTPUT_TOKENS
    cached_input_tokens: int = 0
    reasoning_tokens: int = 0

    @property
    def total_tokens(self) -> int:
        return self.input_tokens + self.output_tokens


@dataclass(frozen=True)
class ToolCall:
    """A call the model asks for. ``freeform`` marks a Responses custom tool (raw text input)."""

    name: str
    arguments: Mapping[str, Any] = field(default_factory=dict)
    freeform_input: str | None = None

    @property
    def freeform(self) -> bool:
        return self.freeform_input is not None

    def arguments_json(self) -> str:
        return json.dumps(dict(self.arguments), ensure_ascii=False)


@dataclass(frozen=True)
class HttpError:
    """An HTTP error answer; empty ``error_type``/``code`` take the API's usual value."""

    status: int
    message: str
    error_type: str = ""
    code: str | None = None
    param: str | None = None  # OpenAI names the offending field for some errors


@dataclass(frozen=True)
class Turn:
    """One model answer. Exactly one of: a success (text / reasoning / call), ``fail``,
    ``http_error`` or ``context_overflow``."""

    text: str | None = None
    reasoning: str | None = None
    call: ToolCall | None = None
    fail: str | None = None
    fail_code: str | None = None
    http_error: HttpError | None = None
    context_overflow: bool = False
    delay_seconds: float = 0.0
    usage: TurnUsage = field(default_factory=TurnUsage)

    @property
    def succeeds(self) -> bool:
        return self.fail is None and self.http_error is None and not self.context_overflow


_KEYS = frozenset(
    {
        "text",
        "reasoning",
        "tool",
        "custom_tool",
        "fail",
        "code",
        "type",
        "http_status",
        "message",
        "context_overflow",
        "delay_seconds",
        "usage",
    }
)
_USAGE_KEYS = frozenset(
    {"input_tokens", "output_tokens", "cached_input_tokens", "reasoning_tokens"}
)


def _string(raw: Mapping[str, Any], key: str) -> str | None:
    value = raw.get(key)
    if value is not None and not isinstance(value, str):
        raise ScriptError(f"{key!r} must be a string, not {type(value).__name__}")
    return value


def _tool(raw: Any) -> ToolCall:
    if not isinstance(raw, Mapping) or not isinstance(raw.get("name"), str):
        raise ScriptError('"tool" must be {"name": str, "arguments": {...}}')
    arguments = raw.get("arguments", {})
    if isinstance(arguments, str):
        # Accept the wire form too (a JSON string), but it must still decode to an object
        # because the Anthropic wire sends tool input as an object.
        try:
            arguments = json.loads(arguments)
        except json.JSONDecodeError as error:
            raise ScriptError(f"tool arguments are not JSON: {error}") from error
    if not isinstance(arguments, Mapping):
        raise ScriptError("tool arguments must be a JSON object")
    return ToolCall(name=raw["name"], arguments=dict(arguments))


def _custom_tool(raw: Any) -> ToolCall:
    if (
        not isinstance(raw, Mapping)
        or not isinstance(raw.get("name"), str)
        or not isinstance(raw.get("input"), str)
    ):
        raise ScriptError('"custom_tool" must be {"name": str, "input": str}')
    return ToolCall(
        name=raw["name"], arguments={"input": raw["input"]}, freeform_input=raw["input"]
    )


def _usage(raw: Any) -> TurnUsage:
    if raw is None:
        return TurnUsage()
    if not isinstance(raw, Mapping) or not set(raw) <= _USAGE_KEYS:
        raise ScriptError(f"usage takes only {sorted(_USAGE_KEYS)}")
    if not all(isinstance(value, int) and value >= 0 for value in raw.values()):
        raise ScriptError("usage values must be non-negative integers")
    return TurnUsage(**raw)


def parse_turn(raw: Mapping[str, Any]) -> Turn:
    """The :class:`Turn` a script entry describes; ScriptError if it is not a valid one."""
    if not isinstance(raw, Mapping):
        raise ScriptError(f"a turn is a JSON object, not {type(raw).__name__}")
    unknown = set(raw) - _KEYS
    if unknown:
        raise ScriptError(f"unknown turn keys {sorted(unknown)}")
    delay = raw.get("delay_seconds", 0)
    if not isinstance(delay, int | float) or isinstance(delay, bool) or delay < 0:
        raise ScriptError("delay_seconds must be a non-negative number")
    common: dict[str, Any] = {"delay_seconds": float(delay), "usage": _usage(raw.get("usage"))}

    outcomes = [key for key in ("fail", "http_status", "context_overflow") if key in raw]
    answers = [key for key in ("text", "reasoning", "tool", "custom_tool") if key in raw]
    if len(outcomes) > 1 or (outcomes and answers):
        raise ScriptError(f"a turn is one answer or one failure, not {outcomes + answers}")
    if not outcomes and not answers:
        raise ScriptError("a turn needs text, reasoning, tool, custom_tool or a failure")
    if "tool" in raw and "custom_tool" in raw:
        raise ScriptError("one call per turn: tool or custom_tool")
    if ("code" in raw or "type" in raw) and not {"fail", "http_status"} & set(raw):
        raise ScriptError('"code" and "type" belong to "fail" or "http_status"')
    if "message" in raw and "http_status" not in raw:
        raise ScriptError('"message" belongs to "http_status"')

    if "fail" in raw:
        message = _string(raw, "fail")
        return Turn(fail=message, fail_code=_string(raw, "code"), **common)
    if "http_status" in raw:
        status = raw["http_status"]
        if not isinstance(status, int) or isinstance(status, bool) or not 400 <= status <= 599:
            raise ScriptError("http_status must be an HTTP error status (400-599)")
        error = HttpError(
            status=status,
            message=_string(raw, "message") or "",
            error_type=_string(raw, "type") or "",
            code=_string(raw, "code"),
        )
        return Turn(http_error=error, **common)
    if "context_overflow" in raw:
        if raw["context_overflow"] is not True:
            raise ScriptError("context_overflow must be true")
        return Turn(context_overflow=True, **common)

    call = None
    if "tool" in raw:
        call = _tool(raw["tool"])
    elif "custom_tool" in raw:
        call = _custom_tool(raw["custom_tool"])
    return Turn(text=_string(raw, "text"), reasoning=_string(raw, "reasoning"), call=call, **common)


def parse_turns(raw: Sequence[Mapping[str, Any]] | None) -> tuple[Turn, ...]:
    """A whole script; None or [] means stand-in mode (no script)."""
    if raw is None:
        return ()
    if isinstance(raw, str | bytes) or not isinstance(raw, Sequence):
        raise ScriptError("a script is a list of turns")
    turns = []
    for position, entry in enumerate(raw):
        try:
            turns.append(parse_turn(entry))
        except ScriptError as error:
            raise ScriptError(f"turn {position}: {error}") from error
    return tuple(turns)
