"""The line protocol between the Agno adapter and its child process, `executors.agno_runner`.

The worker imports this module, the runner writes it: it needs only the standard library.

Job (stdin, read whole, one UTF-8 JSON object; see `Job`)::

    {"prompt": str, "model": str, "instructions": str, "permission_mode": "full_access"|"read_only",
     "max_turns": int|null, "workspace": str, "state_dir": str, "resume_session_id": str|null,
     "base_url": str|null, "max_retries": int}

The API key is never in the job: it comes from the ``OPENAI_API_KEY`` environment variable, which
the runner removes from its own environment before any tool command can inherit it.

Line protocol (stdout, one JSON object per line, UTF-8, flushed after each line)::

    {"type": "run_started", "session_id": str, "run_id": str, "model": str}
    {"type": "content_delta", "text": str}              a non-empty piece of the answer
    {"type": "tool_started", "call_id": str, "tool": str, "args": {...},
     "command": str}                                    shell tool only: its argv, shell-quoted
    {"type": "tool_completed", "call_id": str, "tool": str, "args": {...}, "is_error": bool,
     "result_chars": int, "result_head": str,           the result's length and first 500 chars
     "command": str, "exit_code": 0|null,               shell tool only; exit_code null: failed
     "files": [{"path": str, "change": "add"|"update"}]}   file-writing tools only
    {"type": "run_completed", "content": str, "metrics": METRICS}
    {"type": "run_error", "error": str, "error_type": str, "http_status": int|null,
     "network_error": bool, "exception": str|null, "metrics": METRICS}

    METRICS = {"input_tokens", "output_tokens", "cache_read_tokens", "cache_write_tokens",
               "reasoning_tokens": int, "cost": float (only when the provider reported one)}

String values in ``args`` longer than 4,096 characters are cut (a saved file's contents, say).
``files[].path`` is relative to the workspace. ``run_completed.content`` is Agno's run content
exactly: the text of *every* model request of the run, concatenated (Agno 3.1.10 does this in
streaming and non-streaming runs alike), which is also what the deltas add up to.
``run_error.error`` is Agno's error text, which for provider errors is only the provider's
message; ``http_status`` (the provider's HTTP status), ``network_error`` (the provider could not
be reached or the stream broke) and ``exception`` (Agno's exception class) come from the exception
the model raised, which Agno's `RunError` event does not carry. ``error_type`` is Agno's
(``model_provider_error``...) or one of the runner's own: ``max_turns``, ``session_not_found``,
``run_cancelled``, ``run_paused``, ``run_incomplete``. A failed run's metrics are the sum over the
model requests that completed before the failure. Exactly one of ``run_completed`` and
``run_error`` ends a run that was not killed.

Exit codes: 0 the run completed, 1 it failed (a ``run_error`` line, or a crash with a traceback on
stderr), 2 the job was unusable (the reason on stderr, nothing on stdout).
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, BinaryIO

EXIT_COMPLETED = 0
EXIT_FAILED = 1
EXIT_BAD_JOB = 2

# Line types of the protocol (see the module docstring).
RUN_STARTED = "run_started"
CONTENT_DELTA = "content_delta"
TOOL_STARTED = "tool_started"
TOOL_COMPLETED = "tool_completed"
RUN_COMPLETED = "run_completed"
RUN_ERROR = "run_error"

# The runner's own error types, next to Agno's.
ERROR_MAX_TURNS = "max_turns"
ERROR_SESSION_NOT_FOUND = "session_not_found"

PERMISSION_MODES = ("full_access", "read_only")

# Agno 3.1.10's tool names (FileTools and ShellTools functions), as the model calls them.
SHELL_TOOL = "run_shell_command"
FILE_WRITING_TOOLS = frozenset({"save_file", "replace_file_chunk"})
FILE_READING_TOOLS = frozenset({"read_file", "read_file_chunk"})

MAX_ARG_CHARS = 4096
RESULT_HEAD_CHARS = 500
# Session ids name a directory under the state dir: one path segment, nothing else.
_SESSION_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}")


class BadJob(ValueError):
    """The job on stdin is not one this runner can run."""


@dataclass(frozen=True)
class Job:
    """One run, as the adapter sends it on stdin; the single definition of the job's shape."""

    prompt: str
    model: str
    instructions: str
    permission_mode: str
    max_turns: int | None
    workspace: str
    state_dir: str
    resume_session_id: str | None
    base_url: str | None
    max_retries: int

    def encode(self) -> bytes:
        return json.dumps(asdict(self), ensure_ascii=False).encode("utf-8")

    @classmethod
    def decode(cls, raw: bytes) -> Job:
        try:
            data = json.loads(raw.decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as error:
            raise BadJob(f"stdin is not one UTF-8 JSON object: {error}") from error
        if not isinstance(data, dict):
            raise BadJob("the job must be a JSON object")
        expected = set(cls.__dataclass_fields__)
        if set(data) != expected:
            raise BadJob(f"the job's keys must be exactly {sorted(expected)}")
        job = cls(**data)
        job._check()
        return job

    def _check(self) -> None:
        for name in ("prompt", "model", "instructions", "workspace", "state_dir"):
            if not isinstance(getattr(self, name), str):
                raise BadJob(f"{name} must be a string")
        if not self.model:
            raise BadJob("model must name a model (the adapter fills in the default)")
        for name in ("resume_session_id", "base_url"):
            if getattr(self, name) is not None and not isinstance(getattr(self, name), str):
                raise BadJob(f"{name} must be a string or null")
        if self.permission_mode not in PERMISSION_MODES:
            raise BadJob(f"permission_mode must be one of {PERMISSION_MODES}")
        if not _is_count(self.max_retries) or (
            self.max_turns is not None and not _is_count(self.max_turns)
        ):
            raise BadJob("max_retries and max_turns must be non-negative integers")
        if self.resume_session_id is not None and not _is_session_id(self.resume_session_id):
            raise BadJob("resume_session_id is not a session id this runner issues")
        if not Path(self.workspace).is_dir():
            raise BadJob("the workspace is not a directory")


def _is_count(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _is_session_id(value: str) -> bool:
    return _SESSION_ID.fullmatch(value) is not None and ".." not in value


class LineWriter:
    """Writes protocol lines to the private duplicate of the original stdout."""

    def __init__(self, stream: BinaryIO) -> None:
        self._stream = stream

    def emit(self, line_type: str, **fields: Any) -> None:
        line = {"type": line_type, **fields}
        try:
            data = json.dumps(line, ensure_ascii=False).encode("utf-8")
        except UnicodeEncodeError:
            # A lone surrogate in model text: \u escapes carry it through JSON unchanged.
            data = json.dumps(line).encode("ascii")
        self._stream.write(data + b"\n")
        self._stream.flush()
