"""Codex's `exec --json` output read as Baton events, an Outcome and one turn's usage.

Usage: Codex reports `turn.completed.usage` cumulatively over a thread (11, 22, 33 over two
resumes). The parser keeps each thread's last cumulative usage in
`<state_dir>/baton-thread-usage/<thread id>.json` and reports the difference, so the usage of a
turn is that turn's alone. One file per thread needs no lock: concurrent runs on one worker share
`state_dir` but never a thread.

A resume of a thread this worker does not have fails with exit 1 and "no rollout found for thread
id …" on stderr; `is_missing_session()` recognises that outcome so the worker can start afresh.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, fields
from pathlib import Path, PurePosixPath
from typing import Any

from executors.adapters.base import bounded_error
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
# What Codex prints (exit 1, stderr) when asked to resume a thread it has no rollout file for.
MISSING_SESSION_PHRASES = ("no rollout found for thread id", "no rollout found for conversation id")
# Codex 0.163 rewrites an HTTP 500 into this text; match without the apostrophe (U+2019 today).
_HIGH_DEMAND = "currently experiencing high demand"
# "unexpected status 401 Unauthorized: …" and "exceeded retry limit, last status: 429 …".
_HTTP_STATUS = re.compile(r"\b(?:unexpected status|last status:) (\d{3})\b")
# Top-level `error` events for a retry in progress: "Reconnecting... 1/5 (<the error>)".
_RETRY_NOTICE = "Reconnecting..."


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
    """The ErrorCode for a Codex failure message (as printed by 0.163 in `turn.failed`)."""
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


_FILE_CHANGE_KINDS = ("add", "update", "delete")


class CodexStreamParser:
    """Maps one run's `codex exec --json` lines onto Baton events and, at the end, an Outcome.

    Event mapping (Codex 0.163): `thread.started` → SessionStarted; `command_execution` items →
    ToolStarted (item.started) and ToolFinished (item.completed); `file_change` → FileChanged
    per change; `agent_message` → MessageCompleted (the last one is the final answer); items of
    type `error` and retry notices → Warning; `turn.completed` → UsageReported with this turn's
    usage. `reasoning` and unknown items are skipped. Lines that are not JSON objects are ignored.

    A top-level `error` is held back one line: when `turn.failed` with the same message follows,
    it was the final error (reported in the Outcome), otherwise a Warning.
    """

    def __init__(self, *, workspace: Path, state_dir: Path) -> None:
        # Codex prints paths under its cwd, which may be the workspace's real path.
        self._workspace_roots = [PurePosixPath(os.path.normpath(os.path.abspath(workspace)))]
        with contextlib.suppress(OSError, RuntimeError, ValueError):
            real = PurePosixPath(os.path.realpath(workspace))
            if real not in self._workspace_roots:
                self._workspace_roots.append(real)
        self._usage_store = ThreadUsageStore(state_dir)
        self.session_id = ""
        self._final_text = ""
        self._completed = False
        self._failure: str | None = None  # turn.failed's message
        self._usage: ThreadUsage | None = None  # this run's usage (a difference of totals)
        self._commands: list[dict[str, Any]] = []
        self._files_changed: list[str] = []
        self._pending_error: str | None = None
        self._last_error: str | None = None  # the last top-level error other than a retry

    def feed(self, line: str) -> list[Event]:
        try:
            message = json.loads(line)
        except (ValueError, RecursionError):  # not JSON, a truncated last line, absurd nesting
            return []
        if not isinstance(message, dict):
            return []
        kind = message.get("type")

        events: list[Event] = []
        pending, self._pending_error = self._pending_error, None
        if pending is not None:
            failed = message.get("error") if kind == "turn.failed" else None
            is_final = isinstance(failed, dict) and failed.get("message") == pending
            if not is_final:
                events.append(Warning(message=pending))

        if kind == "thread.started":
            thread_id = _string(message.get("thread_id"))
            if thread_id:
                self.session_id = thread_id
                events.append(SessionStarted(session_id=thread_id))
        elif kind in ("item.started", "item.completed"):
            item = message.get("item")
            if isinstance(item, dict):
                events += self._item(item, completed=kind == "item.completed")
        elif kind == "turn.completed":
            events += self._turn_completed(message.get("usage"))
        elif kind == "turn.failed":
            error = message.get("error")
            text = _string(error.get("message")) if isinstance(error, dict) else None
            self._failure = text if text else "the turn failed without a message"
        elif kind == "error":
            text = _string(message.get("message"))
            if text:
                self._pending_error = text
                if not text.startswith(_RETRY_NOTICE):
                    self._last_error = text
        return events

    def finish(self, *, exit_code: int, stderr_tail: str) -> Outcome:
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
            error = self._last_error  # a final error printed without turn.failed after it
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

    def _item(self, item: dict[str, Any], *, completed: bool) -> list[Event]:
        item_type = item.get("type")
        call_id = _string(item.get("id")) or ""
        if item_type == "command_execution":
            command = _string(item.get("command"))
            if not completed:
                return [ToolStarted(call_id=call_id, tool="shell", command=command)]
            exit_code = _int(item.get("exit_code"))
            self._commands.append({"command": command, "exit_code": exit_code})
            is_error = item.get("status") in ("failed", "declined") or exit_code not in (None, 0)
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
        if item_type == "agent_message":
            text = _string(item.get("text"))
            if text is None:
                return []
            self._final_text = text
            return [MessageCompleted(text=text)]
        if item_type == "file_change" and item.get("status") != "failed":
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
            if not isinstance(change, dict):
                continue
            raw_path = _string(change.get("path"))
            if not raw_path:
                continue
            path = self._relative(raw_path)
            kind = change.get("kind")
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

    def _turn_completed(self, raw_usage: Any) -> list[Event]:
        self._completed = True
        total = ThreadUsage.from_json(raw_usage)
        if self.session_id:
            turn = total.since(self._usage_store.load(self.session_id))
            self._usage_store.save(self.session_id, total)
        else:
            turn = total  # no thread id seen: nothing to subtract from
        if self._usage is None:
            self._usage = turn
        else:  # a second turn in one run (not seen with exec): add it up
            self._usage = ThreadUsage(
                **{
                    name: value + getattr(turn, name)
                    for name, value in self._usage.to_json().items()
                }
            )
        return [UsageReported(usage=turn.as_usage())]
