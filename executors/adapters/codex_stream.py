"""What `codex app-server` tells Baton about a run, read as Baton events, an Outcome and usage.

The parser is also the run's client side of the conversation (`SteerableParser`): once the
process is started it writes the handshake and `thread/start` (or `thread/resume`), then
`turn/start` with the prompt when the thread is known, answers any request the server makes
of it, and closes stdin when the turn is over, which ends the app-server (it exits 0 on EOF
within about 0.1 s). Steers go through `codex_steering`; the lines themselves are
`codex_rpc`'s.

Usage: Codex reports a thread's token usage cumulatively (`thread/tokenUsage/updated`,
`total`; a resumed thread starts from its earlier total: 11, 22, 33 over two resumes). The
parser keeps each thread's last cumulative usage in
`<state_dir>/baton-thread-usage/<thread id>.json` and reports the difference, so the usage of a
turn is that turn's alone. One file per thread needs no lock: concurrent runs on one worker share
`state_dir` but never a thread.

A resume of a thread this worker does not have is refused: `thread/resume` answers "no rollout
found for thread id …"; `is_missing_session()` recognises that outcome so the worker can start
afresh.
"""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields
from pathlib import Path, PurePosixPath
from typing import Any

from executors.adapters import codex_rpc
from executors.adapters.base import Stdin, SteerResult, bounded_error
from executors.adapters.codex_steering import TurnSteering
from executors.adapters.context_overflow import mentions_context_overflow
from executors.adapters.session_usage import SessionUsageStore
from executors.events import (
    RETRYABLE_CODES,
    ErrorCode,
    Event,
    FileChanged,
    MessageCompleted,
    Outcome,
    OutcomeStatus,
    SessionStarted,
    ToolFinished,
    ToolStarted,
    Usage,
    UsageReported,
    Warning,
)

USAGE_STATE_DIR = "baton-thread-usage"
# What Codex answers to `thread/resume` (and `codex exec resume` printed) for a thread it has no
# rollout file for.
MISSING_SESSION_PHRASES = ("no rollout found for thread id", "no rollout found for conversation id")
# Codex 0.163 rewrites an HTTP 500 into this text; match without the apostrophe (U+2019 today).
_HIGH_DEMAND = "currently experiencing high demand"
# "unexpected status 401 Unauthorized: …" and "exceeded retry limit, last status: 429 …".
_HTTP_STATUS = re.compile(r"\b(?:unexpected status|last status:) (\d{3})\b")


_CAMEL_NAMES = {
    "input_tokens": "inputTokens",
    "cached_input_tokens": "cachedInputTokens",
    "cache_write_input_tokens": "cacheWriteInputTokens",
    "output_tokens": "outputTokens",
    "reasoning_output_tokens": "reasoningOutputTokens",
}


@dataclass(frozen=True)
class ThreadUsage:
    """Codex's usage numbers for a thread so far (its names, cumulative over the thread)."""

    input_tokens: int = 0
    cached_input_tokens: int = 0
    cache_write_input_tokens: int = 0
    output_tokens: int = 0
    reasoning_output_tokens: int = 0

    @classmethod
    def from_json(cls, raw: Any) -> ThreadUsage:
        """Read leniently: a missing or malformed number counts as 0."""
        if not isinstance(raw, Mapping):
            return cls()
        values: dict[str, int] = {}
        for item in fields(cls):
            value = raw.get(item.name)
            if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
                values[item.name] = value
            else:
                values[item.name] = 0
        return cls(**values)

    @classmethod
    def from_breakdown(cls, raw: Any) -> ThreadUsage:
        """Read app-server's `TokenUsageBreakdown` (camelCase names), as leniently."""
        if not isinstance(raw, Mapping):
            return cls()
        return cls.from_json({name: raw.get(camel) for name, camel in _CAMEL_NAMES.items()})

    def to_json(self) -> dict[str, int]:
        return {item.name: getattr(self, item.name) for item in fields(self)}

    def since(self, earlier: ThreadUsage) -> ThreadUsage:
        """This total minus an earlier one of the same thread: the usage in between.

        A total smaller than the earlier one in any field means the earlier record is not of
        this history (a restored state dir, a rewritten thread): the whole total is reported.
        """
        now, before = self.to_json(), earlier.to_json()
        if any(now[name] < before[name] for name in now):
            return self
        return ThreadUsage(**{name: now[name] - before[name] for name in now})

    def as_usage(self) -> Usage:
        return Usage(
            input_tokens=self.input_tokens,
            cached_input_tokens=self.cached_input_tokens,
            cache_write_input_tokens=self.cache_write_input_tokens,
            output_tokens=self.output_tokens,
            reasoning_tokens=self.reasoning_output_tokens,
        )


class ThreadUsageStore:
    """Each thread's last cumulative usage (see `session_usage`)."""

    def __init__(self, state_dir: Path) -> None:
        self._store = SessionUsageStore(state_dir, USAGE_STATE_DIR)

    def load(self, thread_id: str) -> ThreadUsage:
        return ThreadUsage.from_json(self._store.load(thread_id))

    def save(self, thread_id: str, usage: ThreadUsage) -> None:
        self._store.save(thread_id, usage.to_json())


def classify_error(message: str) -> ErrorCode:
    """The ErrorCode for a Codex failure message (a failed turn's `error.message` in 0.163)."""
    lowered = message.lower()
    if "ran out of room in the model's context" in lowered or mentions_context_overflow(lowered):
        # Codex's rewrite of code context_length_exceeded, else the provider's own words (an
        # error without that code is printed as the HTTP body Codex got).
        return ErrorCode.CONTEXT_OVERFLOW
    if any(phrase in lowered for phrase in MISSING_SESSION_PHRASES):
        return ErrorCode.EXECUTOR_ERROR
    if lowered.startswith("quota exceeded"):
        # Billing, not a rate: retrying later will not help, and no closer code exists.
        return ErrorCode.EXECUTOR_ERROR
    status = _HTTP_STATUS.search(lowered)
    if status is not None:
        code = int(status.group(1))
        if code == 429:
            return ErrorCode.RATE_LIMITED
        if code in (401, 403):
            return ErrorCode.AUTH_ERROR
        if code >= 500:
            return ErrorCode.UPSTREAM_ERROR
        return ErrorCode.EXECUTOR_ERROR
    if lowered.startswith("rate limit exceeded"):
        return ErrorCode.RATE_LIMITED
    if "selected model is at capacity" in lowered or _HIGH_DEMAND in lowered:
        return ErrorCode.UPSTREAM_ERROR
    if lowered.startswith(
        ("stream disconnected before completion", "stream closed before", "connection failed")
    ):
        return ErrorCode.NETWORK_ERROR
    return ErrorCode.EXECUTOR_ERROR


def is_missing_session(outcome_or_stderr: Outcome | str) -> bool:
    """Whether a run failed because Codex has no such thread here (a resume on another worker).

    The worker then starts a fresh run instead. Takes the run's Outcome or Codex's stderr.
    """
    if isinstance(outcome_or_stderr, Outcome):
        if outcome_or_stderr.status == OutcomeStatus.COMPLETED:
            return False
        text = outcome_or_stderr.error
    else:
        text = outcome_or_stderr
    lowered = text.lower()
    return any(phrase in lowered for phrase in MISSING_SESSION_PHRASES)


def _stderr_error(stderr_tail: str, exit_code: int) -> str:
    """Codex's own error line from stderr (it prints `Error: …`), else its last lines."""
    lines = [line.strip() for line in stderr_tail.splitlines() if line.strip()]
    for index in range(len(lines) - 1, -1, -1):
        if lines[index].startswith("Error:"):
            return "\n".join(lines[index:])
    # The PATH-alias WARNING is printed on every run from a temporary CODEX_HOME: not a reason.
    reasons = [line for line in lines if not line.startswith("WARNING:")]
    if reasons:
        return "\n".join(reasons[-5:])
    if exit_code < 0:
        return f"codex was killed by signal {-exit_code}"
    return f"codex exited with code {exit_code}"


def _string(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _field(value: Any, name: str) -> Any:
    return value.get(name) if isinstance(value, dict) else None


_FILE_CHANGE_KINDS = ("add", "update", "delete")
_FAILED_STATUSES = ("failed", "declined")


class CodexStreamParser:
    """One run's conversation with `codex app-server`, mapped onto Baton events and an Outcome.

    Requests: `initialize` (+ `initialized`) and `thread/start` (or `thread/resume`) on
    `attach`, `turn/start` with the prompt once the thread's id is known, `turn/steer` per
    steer. Event mapping (Codex 0.163): the thread's id → SessionStarted; `commandExecution`
    items → ToolStarted (item/started) and ToolFinished (item/completed); `fileChange` →
    FileChanged per change; `agentMessage` → MessageCompleted (the last one is the final
    answer); `warning` notifications, `error` notifications of a retry in progress and items of
    type `error` → Warning; `turn/completed` → UsageReported with this turn's usage, and the
    outcome from the turn's status and error. Reasoning, deltas and unknown messages are
    skipped; lines that are not JSON-RPC objects are ignored.
    """

    def __init__(
        self,
        *,
        workspace: Path,
        state_dir: Path,
        prompt: str = "",
        resume_session_id: str | None = None,
        permission_mode: str = "full_access",
    ) -> None:
        # Codex prints paths under its cwd, which may be the workspace's real path.
        self._workspace = workspace
        self._workspace_roots = [PurePosixPath(os.path.normpath(os.path.abspath(workspace)))]
        with contextlib.suppress(OSError, RuntimeError, ValueError):
            real = PurePosixPath(os.path.realpath(workspace))
            if real not in self._workspace_roots:
                self._workspace_roots.append(real)
        self._usage_store = ThreadUsageStore(state_dir)
        self._prompt = prompt
        self._resume_session_id = resume_session_id
        self._permission_mode = permission_mode
        self._steering = TurnSteering()
        self.session_id = ""
        self._turn_id = ""
        self._final_text = ""
        self._completed = False
        self._failure: str | None = None  # the failed turn's (or refused request's) message
        self._total: ThreadUsage | None = None  # the thread's usage after this turn's last call
        self._usage: ThreadUsage | None = None  # this run's usage (a difference of totals)
        self._commands: list[dict[str, Any]] = []
        self._files_changed: list[str] = []
        self._last_error: str | None = None  # the last error notification without a retry

    # -- SteerableParser -------------------------------------------------------------------

    def attach(self, stdin: Stdin) -> None:
        self._steering.attach(stdin)
        self._steering.write(codex_rpc.handshake())
        if self._resume_session_id is not None:
            method = "thread/resume"
            params: dict[str, Any] = {"threadId": self._resume_session_id}
        else:
            method, params = "thread/start", {}
        params.update(codex_rpc.thread_settings(self._workspace, self._permission_mode))
        self._steering.write(codex_rpc.request(codex_rpc.THREAD_ID, method, params))

    def steer(self, text: str, done: Callable[[SteerResult], None]) -> None:
        self._steering.steer(text, done)

    def feed(self, line: str) -> list[Event]:
        incoming = codex_rpc.read_line(line)
        if incoming is None:
            return []
        if incoming.kind == "request":
            self._steering.write(codex_rpc.reply_to(incoming))
            return []
        if incoming.kind == "response":
            return self._response(incoming)
        return self._notification(incoming.method, incoming.params)

    def finish(self, *, exit_code: int, stderr_tail: str) -> Outcome:
        self._steering.end()
        if self._completed:
            return Outcome(
                status=OutcomeStatus.COMPLETED,
                final_text=self._final_text,
                usage=self._usage.as_usage() if self._usage is not None else Usage(),
                session_id=self.session_id,
                commands=tuple(self._commands),
                files_changed=tuple(self._files_changed),
            )
        if self._failure is not None:
            error = self._failure
        elif self._last_error is not None:
            error = self._last_error  # a final error without the turn's end after it
        elif exit_code != 0:
            error = _stderr_error(stderr_tail, exit_code)
        else:
            error = "codex exited without completing the turn"
        code = classify_error(error)
        status = OutcomeStatus.RETRYABLE if code in RETRYABLE_CODES else OutcomeStatus.FAILED
        return Outcome(
            status=status,
            error=bounded_error(error),
            error_code=code,
            session_id=self.session_id,
            commands=tuple(self._commands),
            files_changed=tuple(self._files_changed),
        )

    # -- responses to Baton's requests -------------------------------------------------------

    def _response(self, incoming: codex_rpc.Incoming) -> list[Event]:
        if self._steering.answered(incoming.id, incoming.error):
            self._steering.close_when_settled()
            return []
        method = _REQUEST_METHODS.get(incoming.id) if isinstance(incoming.id, int) else None
        if method is None:
            return []
        if method == "thread":
            method = "thread/resume" if self._resume_session_id is not None else "thread/start"
        if incoming.error is not None:
            # Codex's own words, as `codex exec` printed them: "thread/resume failed: …".
            self._failure = f"{method} failed: {codex_rpc.error_message(incoming.error)}"
            self._steering.close()
            return []
        if method.startswith("thread/"):
            thread_id = _string(_field(_field(incoming.result, "thread"), "id"))
            if not thread_id:
                return []
            self.session_id = thread_id
            prompt = self._prompt.encode("utf-8", errors="replace").decode("utf-8")
            turn = {"threadId": thread_id, "input": codex_rpc.text_input(prompt)}
            self._steering.write(codex_rpc.request(codex_rpc.TURN_ID, "turn/start", turn))
            return [SessionStarted(session_id=thread_id)]
        if method == "turn/start" and not self._turn_id:
            self._turn_id = _string(_field(_field(incoming.result, "turn"), "id")) or ""
        return []

    # -- notifications -----------------------------------------------------------------------

    def _notification(self, method: str, params: Any) -> list[Event]:
        if not isinstance(params, dict):
            return []
        thread_id = params.get("threadId")
        if thread_id is not None and self.session_id and thread_id != self.session_id:
            return []  # another thread's (a sub-agent's): not this run's turn
        if method in ("item/started", "item/completed"):
            item = params.get("item")
            if isinstance(item, dict):
                return self._item(item, completed=method == "item/completed")
            return []
        turn_id = _string(params.get("turnId")) or _string(_field(params.get("turn"), "id"))
        if method == "turn/started":
            if turn_id and (not self._turn_id or turn_id == self._turn_id):
                self._turn_id = turn_id
                self._steering.turn_started(thread_id=self.session_id, turn_id=turn_id)
        elif method == "thread/tokenUsage/updated":
            if turn_id and turn_id == self._turn_id:
                total = _field(params.get("tokenUsage"), "total")
                self._total = ThreadUsage.from_breakdown(total)
        elif method == "turn/completed":
            if turn_id and (not self._turn_id or turn_id == self._turn_id):
                return self._turn_completed(params.get("turn"))
        elif method == "error":
            error = params.get("error")
            text = _string(_field(error, "message"))
            if text:
                if params.get("willRetry") is True:
                    # "Reconnecting... 1/5 (<the error>)", as `codex exec` printed it.
                    details = _string(_field(error, "additionalDetails"))
                    return [Warning(message=f"{text} ({details})" if details else text)]
                self._last_error = text
        elif method == "warning":
            text = _string(params.get("message"))
            return [Warning(message=text)] if text else []
        return []

    def _item(self, item: dict[str, Any], *, completed: bool) -> list[Event]:
        item_type = item.get("type")
        call_id = _string(item.get("id")) or ""
        if item_type == "userMessage":
            client_id = _string(item.get("clientId"))
            if client_id:
                self._steering.user_message(client_id)
            return []
        if item_type == "commandExecution":
            command = _string(item.get("command"))
            if not completed:
                return [ToolStarted(call_id=call_id, tool="shell", command=command)]
            exit_code = _int(item.get("exitCode"))
            self._commands.append({"command": command, "exit_code": exit_code})
            is_error = item.get("status") in _FAILED_STATUSES or exit_code not in (None, 0)
            return [
                ToolFinished(
                    call_id=call_id,
                    tool="shell",
                    command=command,
                    exit_code=exit_code,
                    is_error=is_error,
                )
            ]
        if not completed:
            return []  # file changes are reported once applied, messages only when whole
        if item_type == "agentMessage":
            text = _string(item.get("text"))
            if text is None:
                return []
            self._final_text = text
            return [MessageCompleted(text=text)]
        if item_type == "fileChange" and item.get("status") not in _FAILED_STATUSES:
            return self._file_changes(item.get("changes"))
        if item_type == "error":
            text = _string(item.get("message"))
            return [Warning(message=text)] if text else []
        return []  # reasoning (a summary of the model's thinking) and item types not seen yet

    def _file_changes(self, changes: Any) -> list[Event]:
        if not isinstance(changes, list):
            return []
        events: list[Event] = []
        for change in changes:
            raw_path = _string(_field(change, "path"))
            if not raw_path:
                continue
            path = self._relative(raw_path)
            kind = _field(change, "kind")
            kind = _field(kind, "type") if isinstance(kind, dict) else kind
            # The event promises one of three words; an unknown kind still changed the file.
            events.append(
                FileChanged(path=path, change=kind if kind in _FILE_CHANGE_KINDS else "update")
            )
            if path not in self._files_changed:
                self._files_changed.append(path)
        return events

    def _relative(self, raw_path: str) -> str:
        """`raw_path` relative to the workspace when inside it (Codex prints absolute paths)."""
        path = PurePosixPath(os.path.normpath(raw_path))
        if not path.is_absolute():
            return str(path)
        for root in self._workspace_roots:
            if path != root and path.is_relative_to(root):
                return str(path.relative_to(root))
        return str(path)

    def _turn_completed(self, turn: Any) -> list[Event]:
        self._steering.turn_completed()
        events: list[Event] = []
        lost = self._steering.lost_deliveries()
        if lost:
            events.append(
                Warning(message=f"{lost} steered message(s) were accepted but never recorded")
            )
        status = _field(turn, "status")
        if status == "completed":
            events += self._usage_of_turn()
        elif status == "interrupted":
            self._failure = "the turn was interrupted"
        else:
            error = _string(_field(_field(turn, "error"), "message"))
            self._failure = error or self._last_error or "the turn failed without a message"
        self._steering.close_when_settled()
        return events

    def _usage_of_turn(self) -> list[Event]:
        self._completed = True
        total = self._total if self._total is not None else ThreadUsage()
        if self.session_id:
            turn = total.since(self._usage_store.load(self.session_id))
            self._usage_store.save(self.session_id, total)
        else:
            turn = total  # no thread id seen: nothing to subtract from
        self._usage = turn
        return [UsageReported(usage=turn.as_usage())]


_REQUEST_METHODS = {
    codex_rpc.INITIALIZE_ID: "initialize",
    codex_rpc.THREAD_ID: "thread",
    codex_rpc.TURN_ID: "turn/start",
}
