"""The Agno adapter: runs `executors.agno_runner` in a child process and reads its line protocol.

Agno is a library, but a run must be killable as a process tree and must not share the worker's
memory, so each run is a ``python -P -m executors.agno_runner`` child (see
`executors.agno_protocol` for the job on stdin and the JSON lines on stdout). The worker never
imports Agno or openai: `locate()` only checks that they are installed, which keeps the worker's
start fast (importing them costs about a second) and its memory small.

`AgnoStreamParser` is pure: runner lines in, normalized events and one `Outcome` out. Agno keeps
only the provider's message of a failed model call, so the runner adds the HTTP status it found on
the exception; failures are classified on that status first and on the message's wording second.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import sys
from importlib import metadata
from pathlib import Path
from typing import Any, ClassVar

import executors
from executors import agno_protocol
from executors.adapters.base import (
    ExecutorAdapter,
    ExecutorUnavailable,
    Launch,
    RunRequest,
)
from executors.adapters.context_overflow import mentions_context_overflow
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

logger = logging.getLogger(__name__)

TESTED_AGNO_VERSION = "3.1.10"
DEFAULT_MODEL = "gpt-5.5"  # when the bot names none; a slug the stand-in lists too
INSTALL_HINT = f"pip install 'baton[executors]' (or agno=={TESTED_AGNO_VERSION} openai==3.57.0)"
STDERR_TAIL_CHARS = 2000  # of the runner's stderr, in the error of a run that crashed

# The directory that holds the `executors` package: the child imports it from there, whether the
# worker runs from a checkout or from an installed package.
_EXECUTORS_ROOT = Path(executors.__file__).resolve().parent.parent


class AgnoAdapter(ExecutorAdapter):
    kind: ClassVar[str] = "agno"
    # One JSON db directory per session (`agno_runner`).
    session_files: ClassVar[tuple[str, ...]] = ("sessions",)

    def _find(self) -> str:
        """The Python that runs the runner (this one), once agno and openai are found in it."""
        # find_spec looks a package up without importing it: the worker stays free of both.
        missing = [name for name in ("agno", "openai") if importlib.util.find_spec(name) is None]
        if missing:
            raise ExecutorUnavailable(
                f"the Agno executor needs {' and '.join(missing)} in {sys.executable}: "
                f"{INSTALL_HINT}"
            )
        version = metadata.version("agno")
        if version != TESTED_AGNO_VERSION:
            logger.warning(
                "agno %s is installed; Baton's Agno runner is tested with %s",
                version,
                TESTED_AGNO_VERSION,
            )
        return sys.executable

    def launch(self, request: RunRequest) -> Launch:
        job = agno_protocol.Job(
            prompt=request.prompt,
            model=request.bot.model or DEFAULT_MODEL,
            instructions=request.bot.instructions,
            permission_mode=request.bot.permission_mode,
            max_turns=request.bot.max_turns,
            workspace=str(request.workspace),
            state_dir=str(request.state_dir),
            resume_session_id=request.resume_session_id,
            base_url=request.endpoint.base_url,
            max_retries=request.endpoint.max_retries,
        )
        return Launch(
            # -P: the cwd is the workspace, whose files must never shadow the runner's imports.
            argv=[sys.executable, "-P", "-m", "executors.agno_runner"],
            env=self._env(request),
            cwd=request.workspace,
            stdin=job.encode(),
        )

    def parser(self, request: RunRequest) -> AgnoStreamParser:
        return AgnoStreamParser()

    @staticmethod
    def _env(request: RunRequest) -> dict[str, str]:
        env = dict(request.passthrough_env)
        python_path = [str(_EXECUTORS_ROOT)]
        if env.get("PYTHONPATH"):
            python_path.append(env["PYTHONPATH"])
        env.update(
            HOME=str(request.state_dir / "home"),
            TMPDIR=str(request.tmp_dir),
            AGNO_TELEMETRY="false",  # else Agno reports runs to os-api.agno.com
            PYTHONPATH=":".join(python_path),
            PYTHONUNBUFFERED="1",
        )
        if request.endpoint.api_key is not None:
            env["OPENAI_API_KEY"] = request.endpoint.api_key
        return env


class AgnoStreamParser:
    """Maps the runner's lines (see `executors.agno_protocol`) to events and the run's outcome."""

    def __init__(self) -> None:
        self._session_id = ""
        self._completed: dict[str, Any] | None = None
        self._error: dict[str, Any] | None = None
        self._commands: list[dict[str, Any]] = []
        self._files: dict[str, None] = {}  # insertion-ordered set of changed paths

    def feed(self, line: str) -> list[Event]:
        try:
            data = json.loads(line)
        except json.JSONDecodeError:
            return []
        if not isinstance(data, dict):
            return []
        kind = data.get("type")
        if kind == agno_protocol.RUN_STARTED:
            self._session_id = str(data.get("session_id") or "")
            return [SessionStarted(session_id=self._session_id)]
        if kind == agno_protocol.CONTENT_DELTA:
            return [MessageDelta(text=str(data.get("text") or ""))]
        if kind == agno_protocol.TOOL_STARTED:
            return [
                ToolStarted(
                    call_id=str(data.get("call_id") or ""),
                    tool=str(data.get("tool") or ""),
                    command=data.get("command"),
                )
            ]
        if kind == agno_protocol.TOOL_COMPLETED:
            return self._tool_completed(data)
        if kind == agno_protocol.RUN_COMPLETED:
            self._completed = data
            return [
                MessageCompleted(text=str(data.get("content") or "")),
                UsageReported(usage=_usage(data.get("metrics"))),
            ]
        if kind == agno_protocol.RUN_ERROR:
            self._error = data
            usage = _usage(data.get("metrics"))
            return [UsageReported(usage=usage)] if usage != Usage() else []
        return []

    def finish(self, *, exit_code: int, stderr_tail: str) -> Outcome:
        common: dict[str, Any] = {
            "session_id": self._session_id,
            "commands": tuple(self._commands),
            "files_changed": tuple(self._files),
        }
        if self._completed is not None and exit_code == agno_protocol.EXIT_COMPLETED:
            return Outcome(
                status=OutcomeStatus.COMPLETED,
                final_text=str(self._completed.get("content") or ""),
                usage=_usage(self._completed.get("metrics")),
                **common,
            )
        if self._error is not None:
            code = classify_failure(self._error)
            usage = _usage(self._error.get("metrics"))
            return Outcome(
                status=OutcomeStatus.RETRYABLE if code in RETRYABLE_CODES else OutcomeStatus.FAILED,
                error=str(self._error.get("error") or ""),
                error_code=code,
                usage=usage if usage != Usage() else None,
                **common,
            )
        return Outcome(
            status=OutcomeStatus.FAILED,
            error=_crash_message(exit_code, stderr_tail, completed=self._completed is not None),
            error_code=ErrorCode.EXECUTOR_ERROR,
            **common,
        )

    def _tool_completed(self, data: dict[str, Any]) -> list[Event]:
        call_id = str(data.get("call_id") or "")
        tool = str(data.get("tool") or "")
        command = data.get("command")
        exit_code = data.get("exit_code")
        events: list[Event] = [
            ToolFinished(
                call_id=call_id,
                tool=tool,
                command=command,
                exit_code=exit_code,
                is_error=bool(data.get("is_error")),
            )
        ]
        if tool == agno_protocol.SHELL_TOOL and command is not None:
            self._commands.append({"command": command, "exit_code": exit_code})
        for change in data.get("files") or ():
            path = str(change.get("path") or "")
            if path:
                self._files.setdefault(path, None)
                events.append(FileChanged(path=path, change=str(change.get("change") or "update")))
        return events


# Wordings of provider errors, for failures whose HTTP status the runner could not see (and
# recordings made without it). Each is what the provider sends, which Agno passes on unchanged.
_RATE_LIMIT_WORDS = ("rate limit", "rate_limit", "too many requests")
_AUTH_WORDS = ("incorrect api key", "invalid_api_key", "api_key not set", "unauthorized")
_UPSTREAM_WORDS = ("the server had an error", "overloaded", "internal server error")
_NETWORK_WORDS = ("connection error", "timed out")


def classify_failure(error: dict[str, Any]) -> ErrorCode:
    """The error code of a runner `run_error` line: its runner error type, then the provider's
    HTTP status, then the network flag, then the message's wording."""
    error_type = error.get("error_type")
    if error_type == agno_protocol.ERROR_MAX_TURNS:
        return ErrorCode.MAX_TURNS
    if error_type == agno_protocol.ERROR_SESSION_NOT_FOUND:
        return ErrorCode.EXECUTOR_ERROR
    text = str(error.get("error") or "").lower()
    status = error.get("http_status")
    # Before the status: a context overflow is a plain 400, which means nothing by itself.
    if error.get("exception") == "ContextWindowExceededError" or mentions_context_overflow(text):
        return ErrorCode.CONTEXT_OVERFLOW
    if isinstance(status, int) and not isinstance(status, bool):
        if status == 429:
            return ErrorCode.RATE_LIMITED
        if status in (401, 403):
            return ErrorCode.AUTH_ERROR
        if status >= 500:
            return ErrorCode.UPSTREAM_ERROR
        return ErrorCode.EXECUTOR_ERROR
    if error.get("network_error") is True:
        return ErrorCode.NETWORK_ERROR
    if error.get("exception") == "ModelAuthenticationError" or _mentions(text, _AUTH_WORDS):
        return ErrorCode.AUTH_ERROR
    if error.get("exception") == "ModelRateLimitError" or _mentions(text, _RATE_LIMIT_WORDS):
        return ErrorCode.RATE_LIMITED
    if _mentions(text, _UPSTREAM_WORDS):
        return ErrorCode.UPSTREAM_ERROR
    if _mentions(text, _NETWORK_WORDS):
        return ErrorCode.NETWORK_ERROR
    return ErrorCode.EXECUTOR_ERROR


def _mentions(text: str, words: tuple[str, ...]) -> bool:
    return any(word in text for word in words)


def _usage(metrics: Any) -> Usage:
    if not isinstance(metrics, dict):
        return Usage()

    def count(name: str) -> int:
        value = metrics.get(name)
        return value if isinstance(value, int) and not isinstance(value, bool) else 0

    cost = metrics.get("cost")
    return Usage(
        input_tokens=count("input_tokens"),
        cached_input_tokens=count("cache_read_tokens"),
        cache_write_input_tokens=count("cache_write_tokens"),
        output_tokens=count("output_tokens"),
        reasoning_tokens=count("reasoning_tokens"),
        cost_usd=float(cost)
        if isinstance(cost, int | float) and not isinstance(cost, bool)
        else None,
    )


def _crash_message(exit_code: int, stderr_tail: str, *, completed: bool) -> str:
    if exit_code == agno_protocol.EXIT_BAD_JOB:
        head = "the Agno runner rejected its job"
    elif completed:
        head = f"the Agno runner exited with code {exit_code} after reporting completion"
    else:
        head = f"the Agno runner exited with code {exit_code} without reporting a result"
    tail = stderr_tail.strip()[-STDERR_TAIL_CHARS:]
    return f"{head}: {tail}" if tail else head
