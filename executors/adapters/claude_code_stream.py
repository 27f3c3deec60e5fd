"""Claude Code's stream-json output read as Baton events, an Outcome and one turn's usage.

Outcome: success is `result.is_error == false`, never `subtype` (an HTTP 500 comes back as
`subtype: "success"`, `is_error: true`). Failures are classified from the `result` line's
`api_error_status` / `api_error` / `terminal_reason` and from the `error` kind on the synthetic
assistant message Claude Code prints before it (see `classify_error`). A resume of a session this
worker does not have fails with "No conversation found with session ID: …";
`is_missing_session()` recognises that outcome so the worker can start afresh.

Usage: `modelUsage` and `total_cost_usd` are totals over the session — `--resume` restores them
(11 → 22 → 33 input tokens over three one-request turns) — so the parser keeps each session's
last totals in `<state_dir>/baton-session-usage/<session id>.json` (see `session_usage`) and
reports the difference: a turn's usage and cost are that turn's alone.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields
from pathlib import Path, PurePosixPath
from typing import Any

from executors.adapters.base import MAX_ERROR_CHARS, Stdin, SteerResult, bounded_error
from executors.adapters.claude_code_steering import ClaudeCodeSteering
from executors.adapters.context_overflow import mentions_context_overflow
from executors.adapters.session_usage import SessionUsageStore
from executors.events import (
    RETRYABLE_CODES,
    ErrorCode,
    Event,
    FileChanged,
    MessageCompleted,
    MessageDelta,
    Outcome,
    OutcomeStatus,
    SessionStarted,
    ToolFinished,
    ToolStarted,
    Usage,
    UsageReported,
)

USAGE_STATE_DIR = "baton-session-usage"  # in the state dir: each session's last totals
# What Claude Code prints in `result.errors` when `--resume` names a session it does not have:
# a UUID it has no transcript for, or (the second) anything else that matches no session title.
MISSING_SESSION_PHRASES = (
    "No conversation found with session ID",
    "--resume requires a valid session ID",
)
_COMMAND_TOOL = "Bash"
_FILE_TOOLS = ("Write", "Edit")
# A failed Bash call's result text starts with "Exit code N" (its tool_use_result with "Error: ").
_EXIT_CODE = re.compile(r"^(?:Error: )?Exit code (-?\d+)\b")
# `api_error` kinds (on the result and the synthetic assistant message) for a model endpoint
# that could not be reached or stopped answering: another attempt later may well get through.
_NETWORK_API_ERRORS = frozenset(
    {"connection_failed", "stream_idle_timeout", "no_response", "computer_slept"}
)
# `error` kinds on the synthetic assistant message that name the cause without an HTTP status.
_AUTH_ERRORS = frozenset(
    {"authentication_failed", "oauth_org_not_allowed", "cloud_credential_error"}
)
_UPSTREAM_ERRORS = frozenset({"server_error", "overloaded"})


def classify_error(
    result: Mapping[str, Any], api_error: Mapping[str, Any] | None = None
) -> ErrorCode:
    """The ErrorCode for a failed run, from its `result` line and the synthetic assistant
    message Claude Code prints for an API error (`api_error`: its `error` and `api_error` keys).

    Seen with 2.1.332 against the stand-in: 500/529 → status 500/529, error `server_error`;
    429 → status 429, error `rate_limit`; context overflow → status 400, terminal_reason
    `prompt_too_long`; 401/403 → error `authentication_failed`; a dead port → no status,
    `api_error: "connection_failed"` (with error `server_error`, so network is checked first).
    A 400 whose words say the prompt is too long (Claude Code's own "Prompt is too long" result,
    or the provider's message) is a context overflow without that terminal reason too.
    """
    api_error = api_error or {}
    status = _int(result.get("api_error_status"))
    error_kind = _string(api_error.get("error"))
    network_kind = _string(result.get("api_error")) or _string(api_error.get("api_error"))
    if result.get("subtype") == "error_max_turns" or result.get("terminal_reason") == "max_turns":
        return ErrorCode.MAX_TURNS
    if (
        result.get("terminal_reason") == "prompt_too_long"
        or network_kind == "message_over_context_limit"
        or (status in (None, 400) and _says_context_overflow(result, api_error))
    ):
        return ErrorCode.CONTEXT_OVERFLOW
    if status == 429 or error_kind == "rate_limit":
        return ErrorCode.RATE_LIMITED
    if status in (401, 403) or error_kind in _AUTH_ERRORS:
        return ErrorCode.AUTH_ERROR
    if network_kind in _NETWORK_API_ERRORS:
        return ErrorCode.NETWORK_ERROR
    if (status is not None and status >= 500) or error_kind in _UPSTREAM_ERRORS:
        return ErrorCode.UPSTREAM_ERROR
    return ErrorCode.EXECUTOR_ERROR


def _says_context_overflow(result: Mapping[str, Any], api_error: Mapping[str, Any]) -> bool:
    texts = [_string(result.get("result")) or "", _message_text(api_error)]
    errors = result.get("errors")
    if isinstance(errors, list):
        texts += [error for error in errors if isinstance(error, str)]
    return any(mentions_context_overflow(text) for text in texts)


def is_missing_session(outcome_or_text: Outcome | str) -> bool:
    """Whether a run failed because Claude Code has no such session here (a resume of a
    session another worker, or a wiped state dir, had).

    The worker then starts a fresh run instead. Takes the run's Outcome or an error text.
    """
    if isinstance(outcome_or_text, Outcome):
        if outcome_or_text.error_code != ErrorCode.EXECUTOR_ERROR:
            return False
        text = outcome_or_text.error
    else:
        text = outcome_or_text
    return any(phrase in text for phrase in MISSING_SESSION_PHRASES)


def usage_from_result(result: Mapping[str, Any]) -> Usage:
    """Baton's Usage for the run so far, from one `result` line.

    `modelUsage` (per model, totals for the process) is preferred over `usage`: `usage` counts
    the main agent loop since the last result only, and a subagent's calls were missing from it
    while `modelUsage` and `total_cost_usd` (also a process total) had them. Anthropic's input
    count excludes cache reads and writes; Baton's includes both.
    """
    cost = result.get("total_cost_usd")
    cost_usd = float(cost) if isinstance(cost, int | float) and not isinstance(cost, bool) else None
    per_model = result.get("modelUsage")
    if isinstance(per_model, Mapping):
        totals = {"input": 0, "cache_read": 0, "cache_write": 0, "output": 0, "thinking": 0}
        for model in per_model.values():
            if not isinstance(model, Mapping):
                continue
            totals["input"] += _count(model.get("inputTokens"))
            totals["cache_read"] += _count(model.get("cacheReadInputTokens"))
            totals["cache_write"] += _count(model.get("cacheCreationInputTokens"))
            totals["output"] += _count(model.get("outputTokens"))
            totals["thinking"] += _count(model.get("thinkingTokens"))
    else:
        raw = result.get("usage")
        raw = raw if isinstance(raw, Mapping) else {}
        details = raw.get("output_tokens_details")
        totals = {
            "input": _count(raw.get("input_tokens")),
            "cache_read": _count(raw.get("cache_read_input_tokens")),
            "cache_write": _count(raw.get("cache_creation_input_tokens")),
            "output": _count(raw.get("output_tokens")),
            "thinking": _count(details.get("thinking_tokens"))
            if isinstance(details, Mapping)
            else 0,
        }
    return Usage(
        input_tokens=totals["input"] + totals["cache_read"] + totals["cache_write"],
        cached_input_tokens=totals["cache_read"],
        cache_write_input_tokens=totals["cache_write"],
        output_tokens=totals["output"],
        reasoning_tokens=min(totals["thinking"], totals["output"]),
        cost_usd=cost_usd,
    )


def _stored_usage(raw: Any) -> Usage:
    """A session's saved totals (`Usage.to_json()`), leniently: bad numbers count as 0."""
    raw = raw if isinstance(raw, Mapping) else {}
    cost = raw.get("cost_usd")
    return Usage(
        **{
            item.name: _count(raw.get(item.name))
            for item in fields(Usage)
            if item.name != "cost_usd"
        },
        cost_usd=float(cost)
        if isinstance(cost, int | float) and not isinstance(cost, bool)
        else None,
    )


def _usage_since(total: Usage, earlier: Usage) -> Usage:
    """What `total` adds to `earlier`, totals of one session; all of it if any number fell
    (the earlier totals are not of this history: a restored state dir, a session Claude Code
    did not restore)."""
    numbers = [item.name for item in fields(Usage) if item.name != "cost_usd"]
    if any(getattr(total, name) < getattr(earlier, name) for name in numbers):
        return total
    cost = total.cost_usd
    if cost is not None and earlier.cost_usd:
        # Rounded so that equal totals give 0.0 and not float noise such as 2e-19.
        cost = round(max(cost - earlier.cost_usd, 0.0), 12)
    return Usage(
        **{name: getattr(total, name) - getattr(earlier, name) for name in numbers},
        cost_usd=cost,
    )


def _string(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _count(value: Any) -> int:
    number = _int(value)
    return number if number is not None and number > 0 else 0


def _bounded_tail(text: str, limit: int) -> str:
    """At most `limit` characters of `text`, keeping its end (a crash's last words)."""
    text = text.strip()
    if len(text) <= limit:
        return text
    return "…" + text[len(text) - limit + 1 :]


@dataclass(frozen=True)
class _ToolUse:
    name: str
    command: str | None  # Bash only
    file_path: str | None  # Write / Edit only


class ClaudeCodeStreamParser:
    """Maps one run's stream-json lines onto Baton events and, at the end, an Outcome.

    Event mapping (Claude Code 2.1.332): `system`/`init` → SessionStarted; `stream_event`
    text deltas → MessageDelta; `assistant` text blocks → MessageCompleted and `tool_use` blocks
    → ToolStarted; `user` `tool_result` blocks → ToolFinished, plus FileChanged for a Write or
    Edit that succeeded; `result` → UsageReported. Text from subagents (lines with a
    `parent_tool_use_id`) is not the answer and is skipped; their tool calls are reported, since
    they ran in the workspace. Lines that are not JSON objects are ignored.

    It is a `SteerableParser`: attached to the run's stdin, it writes steers there and closes
    it after the run's last `result` (see `claude_code_steering`).
    """

    def __init__(self, *, workspace: Path, state_dir: Path | None = None) -> None:
        self._workspace = PurePosixPath(os.path.normpath(os.path.abspath(workspace)))
        # Where each session's last totals are kept; None keeps none (a run's totals are its own).
        self._usage_store = (
            None if state_dir is None else SessionUsageStore(state_dir, USAGE_STATE_DIR)
        )
        self.session_id = ""
        self._result: dict[str, Any] | None = None
        self._api_error: dict[str, Any] | None = None  # the last synthetic API-error message
        self._before: Usage | None = None  # the session's totals before this run
        self._usage = Usage(cost_usd=0.0)  # this run's usage up to the last result line
        self._tools: dict[str, _ToolUse] = {}
        self._commands: list[dict[str, Any]] = []
        self._files_changed: list[str] = []
        self._steering = ClaudeCodeSteering()

    def attach(self, stdin: Stdin) -> None:
        self._steering.attach(stdin)

    def steer(self, text: str, done: Callable[[SteerResult], None]) -> None:
        self._steering.steer(text, done)

    def feed(self, line: str) -> list[Event]:
        try:
            message = json.loads(line)
        except (ValueError, RecursionError):  # not JSON, a truncated last line, absurd nesting
            return []
        if not isinstance(message, dict):
            return []
        kind = message.get("type")
        if kind == "system" and message.get("subtype") == "init":
            session_id = _string(message.get("session_id"))
            if session_id and session_id != self.session_id:
                self.session_id = session_id
                return [SessionStarted(session_id=session_id)]
        elif kind == "stream_event":
            return self._stream_event(message)
        elif kind == "assistant":
            return self._assistant(message)
        elif kind == "user":
            return self._user(message)
        elif kind == "result":
            events = self._result_line(message)
            self._steering.result_seen()
            return events
        elif kind == "command_lifecycle":
            command_uuid = _string(message.get("command_uuid"))
            state = _string(message.get("state"))
            if command_uuid and state:
                self._steering.lifecycle(command_uuid, state)
        return []

    def _result_line(self, result: dict[str, Any]) -> list[Event]:
        # Usually one per run; a background subagent finishing after the main loop's answer
        # resumes the loop and a second result follows, and so does a steer that came too late
        # for the running turn and started one of its own. Its numbers are totals for the session
        # so far — after `--resume` Claude Code restores the session's earlier totals — so the
        # run's usage is the total less what the session had before it, and the event reports
        # what this result added.
        self._result = result
        total = usage_from_result(result)
        session_id = self.session_id or _string(result.get("session_id")) or ""
        store = self._usage_store if session_id and not self.missing_session else None
        if self._before is None:
            self._before = _stored_usage(store.load(session_id)) if store else Usage()
        run = _usage_since(total, self._before)
        added = _usage_since(run, self._usage)
        self._usage = run
        if store is not None:
            store.save(session_id, total.to_json())
        return [UsageReported(usage=added)]

    @property
    def missing_session(self) -> bool:
        """Whether the run's result says the session to resume does not exist here."""
        result = self._result
        if result is None or result.get("is_error") is not True or result.get("num_turns") != 0:
            return False
        errors = result.get("errors")
        texts = (
            [text for text in errors if isinstance(text, str)] if isinstance(errors, list) else []
        )
        return any(is_missing_session(text) for text in texts)

    def finish(self, *, exit_code: int, stderr_tail: str) -> Outcome:
        self._steering.run_ended()
        result = self._result
        common: dict[str, Any] = {
            "commands": tuple(self._commands),
            "files_changed": tuple(self._files_changed),
        }
        if result is None:
            # A crash or a kill: Claude Code always prints a result line when it ends by itself.
            error = f"Claude Code exited with code {exit_code} without a result"
            if stderr_tail.strip():
                error += ": "
                error += _bounded_tail(stderr_tail, MAX_ERROR_CHARS - len(error))
            return Outcome(
                status=OutcomeStatus.FAILED,
                error=error,
                error_code=ErrorCode.EXECUTOR_ERROR,
                session_id=self.session_id,
                **common,
            )
        usage = self._usage
        session_id = self.session_id
        if not session_id and not self.missing_session:
            session_id = _string(result.get("session_id")) or ""
        if result.get("is_error") is False:
            final_text = result.get("result")
            return Outcome(
                status=OutcomeStatus.COMPLETED,
                final_text=final_text if isinstance(final_text, str) else "",
                usage=usage,
                session_id=session_id,
                **common,
            )
        code = (
            ErrorCode.EXECUTOR_ERROR
            if self.missing_session
            else classify_error(result, self._api_error)
        )
        status = OutcomeStatus.RETRYABLE if code in RETRYABLE_CODES else OutcomeStatus.FAILED
        return Outcome(
            status=status,
            error=bounded_error(self._error_text(result, exit_code)),
            error_code=code,
            usage=usage,
            session_id=session_id,
            **common,
        )

    def _error_text(self, result: Mapping[str, Any], exit_code: int) -> str:
        """Claude Code's own words for the failure."""
        text = _string(result.get("result"))
        if text and text.strip():
            return text
        errors = result.get("errors")
        if isinstance(errors, list):
            texts = [error for error in errors if isinstance(error, str) and error.strip()]
            if texts:
                return "\n".join(texts)
        if self._api_error is not None:
            message_text = _message_text(self._api_error)
            if message_text:
                return message_text
        subtype = _string(result.get("subtype")) or "unknown"
        return f"Claude Code reported an error (subtype {subtype}, exit code {exit_code})"

    def _stream_event(self, message: Mapping[str, Any]) -> list[Event]:
        if message.get("parent_tool_use_id") is not None:
            return []
        event = message.get("event")
        if not isinstance(event, Mapping) or event.get("type") != "content_block_delta":
            return []
        delta = event.get("delta")
        if isinstance(delta, Mapping) and delta.get("type") == "text_delta":
            text = _string(delta.get("text"))
            if text:
                return [MessageDelta(text=text)]
        return []

    def _assistant(self, message: dict[str, Any]) -> list[Event]:
        if message.get("is_api_error_message") is True or message.get("error"):
            # The synthetic message carrying an API error: its text is the error, not an answer.
            self._api_error = message
            return []
        content = _content(message)
        top_level = message.get("parent_tool_use_id") is None
        events: list[Event] = []
        for block in content:
            block_type = block.get("type")
            if block_type == "text" and top_level:
                text = _string(block.get("text"))
                if text:
                    events.append(MessageCompleted(text=text))
            elif block_type == "tool_use":
                events += self._tool_use(block)
        return events

    def _tool_use(self, block: Mapping[str, Any]) -> list[Event]:
        call_id = _string(block.get("id")) or ""
        name = _string(block.get("name")) or "unknown"
        arguments = block.get("input")
        arguments = arguments if isinstance(arguments, Mapping) else {}
        command = _string(arguments.get("command")) if name == _COMMAND_TOOL else None
        file_path = _string(arguments.get("file_path")) if name in _FILE_TOOLS else None
        self._tools[call_id] = _ToolUse(name=name, command=command, file_path=file_path)
        return [ToolStarted(call_id=call_id, tool=name, command=command)]

    def _user(self, message: Mapping[str, Any]) -> list[Event]:
        results = [block for block in _content(message) if block.get("type") == "tool_result"]
        # The structured result sits beside the message, so it belongs to a lone tool_result.
        structured = message.get("tool_use_result") if len(results) == 1 else None
        events: list[Event] = []
        for block in results:
            events += self._tool_result(block, structured)
        return events

    def _tool_result(self, block: Mapping[str, Any], structured: Any) -> list[Event]:
        call_id = _string(block.get("tool_use_id")) or ""
        tool = self._tools.get(call_id, _ToolUse(name="unknown", command=None, file_path=None))
        is_error = block.get("is_error") is True
        is_command = tool.name == _COMMAND_TOOL
        exit_code = _exit_code(block, structured) if is_error and is_command else None
        events: list[Event] = [
            ToolFinished(
                call_id=call_id,
                tool=tool.name,
                command=tool.command,
                exit_code=exit_code,
                is_error=is_error,
            )
        ]
        if is_command:
            self._commands.append({"command": tool.command, "exit_code": exit_code})
        if tool.file_path and not is_error:
            path = self._relative(tool.file_path)
            created = isinstance(structured, Mapping) and structured.get("type") == "create"
            change = "add" if tool.name == "Write" and created else "update"
            events.append(FileChanged(path=path, change=change))
            if path not in self._files_changed:
                self._files_changed.append(path)
        return events

    def _relative(self, raw_path: str) -> str:
        """`raw_path` relative to the workspace when inside it (a relative one is from there)."""
        path = PurePosixPath(os.path.normpath(os.path.join(self._workspace, raw_path)))
        if path != self._workspace and path.is_relative_to(self._workspace):
            return str(path.relative_to(self._workspace))
        return str(path)


def _content(message: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    inner = message.get("message")
    content = inner.get("content") if isinstance(inner, Mapping) else None
    if not isinstance(content, list):
        return []
    return [block for block in content if isinstance(block, Mapping)]


def _message_text(message: Mapping[str, Any]) -> str:
    texts = [_string(block.get("text")) or "" for block in _content(message)]
    return "\n".join(text for text in texts if text)


def _exit_code(block: Mapping[str, Any], structured: Any) -> int | None:
    """A failed Bash call's exit code, from "Exit code N" in its result; else None.

    Claude Code reports no exit code for a call it counts as a success (`grep` finding nothing
    exits 1 and is a success with a `returnCodeInterpretation`), so none is guessed.
    """
    candidates = [structured, block.get("content")]
    for candidate in candidates:
        if isinstance(candidate, str):
            found = _EXIT_CODE.match(candidate)
            if found:
                return int(found.group(1))
    return None
