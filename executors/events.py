"""The normalized progress events and outcome every executor adapter produces.

Each executor speaks its own stream (Codex `app-server` notifications, Claude Code
`stream-json`, Agno's `RunEvent`s); adapters map those onto these few shapes so that the
worker, the backend and the product see one vocabulary. Events carry the executor's content
(message text, commands) because the product shows them; they are posted to the backend, never
written to logs.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from enum import StrEnum
from typing import Any


class ErrorCode(StrEnum):
    """Why a run did not complete; reported to the backend with the outcome."""

    CONTEXT_OVERFLOW = "context_overflow"  # the model refused the prompt's length
    RATE_LIMITED = "rate_limited"  # HTTP 429 from the model provider
    UPSTREAM_ERROR = "upstream_error"  # HTTP 5xx / overloaded provider
    NETWORK_ERROR = "network_error"  # the provider could not be reached or the stream broke
    AUTH_ERROR = "auth_error"  # 401 / 403 from the provider: a configuration problem
    MAX_TURNS = "max_turns"  # the bot's max_turns ran out before a final answer
    TIMEOUT = "timeout"  # the bot's timeout ran out; the worker stopped the run
    CANCELLED = "cancelled"  # the product cancelled the turn
    ARTIFACT_ERROR = "artifact_error"  # a manifest artifact could not be materialized safely
    EXECUTOR_ERROR = "executor_error"  # the executor failed in a way not classified above
    SHUTDOWN = "shutdown"  # the worker stopped before the run finished (a release)


# Failures worth another attempt on a later claim: the same prompt may well succeed then.
RETRYABLE_CODES = frozenset(
    {ErrorCode.RATE_LIMITED, ErrorCode.UPSTREAM_ERROR, ErrorCode.NETWORK_ERROR}
)


@dataclass(frozen=True)
class Usage:
    """One turn's token usage (never cumulative over a session) and its cost when known.

    The backend's usage schema: `input_tokens` counts every input token, including the subsets
    `cached_input_tokens` (read from a prompt cache) and `cache_write_input_tokens` (written to
    one); `output_tokens` includes the subset `reasoning_tokens`.
    """

    input_tokens: int = 0
    cached_input_tokens: int = 0
    cache_write_input_tokens: int = 0
    output_tokens: int = 0
    reasoning_tokens: int = 0
    cost_usd: float | None = None

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        if self.cost_usd is None:
            del data["cost_usd"]
        return data


@dataclass(frozen=True)
class Event:
    """Base class; `type` names the event in the JSON posted to the backend."""

    type = "event"

    def to_json(self) -> dict[str, Any]:
        return {"type": self.type, **asdict(self)}


@dataclass(frozen=True)
class SessionStarted(Event):
    """The executor's own session (Codex thread, Claude Code session, Agno session) id."""

    type = "session_started"
    session_id: str


@dataclass(frozen=True)
class MessageDelta(Event):
    """A piece of the answer as it streams; the worker accumulates them into partial text."""

    type = "message_delta"
    text: str


@dataclass(frozen=True)
class MessageCompleted(Event):
    """One whole assistant message (an intermediate one, or the final answer)."""

    type = "message_completed"
    text: str


@dataclass(frozen=True)
class ToolStarted(Event):
    type = "tool_started"
    call_id: str
    tool: str
    command: str | None = None  # the shell command, for command tools


@dataclass(frozen=True)
class ToolFinished(Event):
    type = "tool_finished"
    call_id: str
    tool: str
    command: str | None = None
    exit_code: int | None = None
    is_error: bool = False


@dataclass(frozen=True)
class FileChanged(Event):
    type = "file_changed"
    path: str  # relative to the workspace when it lies inside it
    change: str  # "add", "update" or "delete"


@dataclass(frozen=True)
class UsageReported(Event):
    type = "usage"
    usage: Usage = field(default_factory=Usage)


@dataclass(frozen=True)
class Warning(Event):  # noqa: A001 - the executor's own word for these
    """A non-fatal notice from the executor (unknown model metadata, a reconnect)."""

    type = "warning"
    message: str


class OutcomeStatus(StrEnum):
    COMPLETED = "completed"
    FAILED = "failed"  # permanent: another attempt would fail the same way
    RETRYABLE = "retryable"  # transient: worth another claim later


@dataclass(frozen=True)
class Outcome:
    """How one run ended, as the adapter's parser saw it."""

    status: OutcomeStatus
    final_text: str | None = None  # the executor's final answer exactly as it returned it
    error: str = ""
    error_code: ErrorCode | None = None
    usage: Usage | None = None
    session_id: str = ""
    commands: tuple[dict[str, Any], ...] = ()  # {"command", "exit_code"} of each command run
    files_changed: tuple[str, ...] = ()  # workspace-relative paths, in first-change order
