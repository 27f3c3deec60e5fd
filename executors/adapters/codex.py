"""The Codex CLI adapter: `codex exec --json` as a subprocess, its JSONL mapped onto Baton's events.

Verified against `openai-codex-cli-bin==0.163.0` and the stand-in model server; every flag and
override below was checked to do what its comment says, because Codex changes behaviour between
releases (see /work/shared/EXECUTORS.md §1).

Configuration comes from `-c` overrides alone: `--ignore-user-config` makes Codex skip both
`$CODEX_HOME/config.toml` and a `.codex/config.toml` in the workspace. The workspace is task
content; without the flag, a `.codex/config.toml` placed there did change the request (its
`developer_instructions` reached the model). The model provider is always a custom one named
`baton`, because Codex 0.163 ignores `OPENAI_BASE_URL`.

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
import logging
import os
import re
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, fields
from pathlib import Path, PurePosixPath
from typing import Any

from executors.adapters.base import (
    ExecutorAdapter,
    ExecutorUnavailable,
    Launch,
    RunRequest,
)
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

logger = logging.getLogger(__name__)

PINNED_PACKAGE = "openai-codex-cli-bin==0.163.0"
INSTALL_HINT = (
    f"install it with `pip install 'baton[executors]'` (or `pip install {PINNED_PACKAGE}`)"
)
DEFAULT_BASE_URL = "https://api.openai.com/v1"
PROVIDER_ID = "baton"
API_KEY_VARIABLE = "OPENAI_API_KEY"  # the provider's env_key: Codex sends it as a Bearer token
USAGE_STATE_DIR = "baton-thread-usage"
MAX_ERROR_CHARS = 4000
# What Codex prints (exit 1, stderr) when asked to resume a thread it has no rollout file for.
MISSING_SESSION_PHRASES = ("no rollout found for thread id", "no rollout found for conversation id")

# Linux refuses one argument of 128 KiB or more (MAX_ARG_STRLEN, counting the NUL).
_MAX_ARGUMENT_BYTES = 128 * 1024 - 1
_PERMISSION_MODES = ("full_access", "read_only")
# Codex 0.163 rewrites an HTTP 500 into this text; match without the apostrophe (U+2019 today).
_HIGH_DEMAND = "currently experiencing high demand"
# "unexpected status 401 Unauthorized: …" and "exceeded retry limit, last status: 429 …".
_HTTP_STATUS = re.compile(r"\b(?:unexpected status|last status:) (\d{3})\b")
# Top-level `error` events for a retry in progress: "Reconnecting... 1/5 (<the error>)".
_RETRY_NOTICE = "Reconnecting..."


class CodexAdapter(ExecutorAdapter):
    """Runs the Codex CLI bundled in the `openai-codex-cli-bin` wheel."""

    kind = "codex"

    def _find(self) -> str:
        """The bundled `codex` binary's path, found once per adapter."""
        return _bundled_binary()

    def missing_session(self, outcome: Outcome) -> bool:
        return is_missing_session(outcome)

    def launch(self, request: RunRequest) -> Launch:
        """`codex exec` (or `codex exec resume <id>`) with the prompt on stdin.

        Raises ValueError for a request Codex cannot run as asked: an unknown permission mode, a
        resume id that is not a UUID (Codex would treat it as a thread *name*, find none and
        silently start a new thread), or instructions too long for one argument.
        """
        argv = [self.locate(), "exec"]
        if request.resume_session_id is not None:
            argv += ["resume", _thread_id(request.resume_session_id)]
        argv += [
            "--json",
            "--skip-git-repo-check",
            "--ignore-user-config",  # no config from CODEX_HOME or the workspace: see module doc
            "--ignore-rules",  # nor execpolicy .rules files, for the same reason
            *_permission_flags(request.bot.permission_mode),
            *_config_flags(request),
            "-",  # read the prompt from stdin; Launch.stdin is written whole, then closed
        ]
        # bot.max_turns is not passed: `codex exec` 0.163 has no turn limit (no flag, and no
        # such key in the binary's config schema); the worker's timeout bounds a run instead.
        for argument in argv:
            if len(os.fsencode(argument)) > _MAX_ARGUMENT_BYTES:
                raise ValueError("a Codex argument (the bot's instructions?) exceeds 128 KiB")

        state_dir = request.state_dir
        home = state_dir / "home"
        home.mkdir(parents=True, exist_ok=True)  # CODEX_HOME must exist before Codex starts
        env = dict(request.passthrough_env)
        env.pop(API_KEY_VARIABLE, None)  # only the endpoint's key, never an inherited one
        env.update(
            {
                "CODEX_HOME": str(state_dir),
                "HOME": str(home),
                "TMPDIR": str(request.tmp_dir),
            }
        )
        if request.endpoint.api_key is not None:
            env[API_KEY_VARIABLE] = request.endpoint.api_key
        # A lone surrogate cannot be sent as UTF-8 at all: it becomes "?" instead of no run.
        stdin = request.prompt.encode("utf-8", errors="replace")
        return Launch(argv=argv, env=env, cwd=request.workspace, stdin=stdin)

    def parser(self, request: RunRequest) -> CodexStreamParser:
        return CodexStreamParser(workspace=request.workspace, state_dir=request.state_dir)


def _bundled_binary() -> str:
    try:
        import codex_cli_bin
    except ImportError as error:
        raise ExecutorUnavailable(f"the Codex CLI is not installed: {INSTALL_HINT}") from error
    try:
        path = codex_cli_bin.bundled_codex_path()
    except (FileNotFoundError, OSError) as error:
        raise ExecutorUnavailable(
            f"the Codex CLI package is incomplete ({error}): {INSTALL_HINT}"
        ) from error
    if not path.is_file() or not os.access(path, os.X_OK):
        raise ExecutorUnavailable(f"the Codex CLI at {path} is not executable: {INSTALL_HINT}")
    return str(path)


def _thread_id(session_id: str) -> str:
    try:
        return str(uuid.UUID(session_id))
    except ValueError:
        raise ValueError(f"{session_id!r} is not a Codex thread id (a UUID)") from None


def _permission_flags(permission_mode: str) -> list[str]:
    if permission_mode == "full_access":
        # No sandbox and no approvals: commands run as the worker's user, in the workspace.
        return ["--dangerously-bypass-approvals-and-sandbox"]
    if permission_mode == "read_only":
        # Codex's bwrap sandbox (shipped in the wheel; it works in this container): commands
        # may read anything but write nowhere (workspace, TMPDIR, HOME) and have no network;
        # apply_patch is rejected. Approval "never" turns a request to escalate into a refusal
        # the model sees. `-c` rather than `--sandbox`, because `exec resume` has no --sandbox.
        return ["-c", 'sandbox_mode="read-only"', "-c", 'approval_policy="never"']
    raise ValueError(f"unknown permission mode {permission_mode!r}; expected {_PERMISSION_MODES}")


def _config_flags(request: RunRequest) -> list[str]:
    """The `-c key=value` overrides: provider, retries, network hygiene, model, instructions."""
    endpoint = request.endpoint
    provider = f"model_providers.{PROVIDER_ID}"
    retries = max(endpoint.max_retries, 0)
    overrides = [
        f"model_provider={toml_string(PROVIDER_ID)}",
        f"{provider}.name={toml_string(PROVIDER_ID)}",
        f"{provider}.base_url={toml_string(endpoint.base_url or DEFAULT_BASE_URL)}",
        f"{provider}.wire_api={toml_string('responses')}",  # "chat" is rejected by 0.163
        f"{provider}.request_max_retries={retries}",
        f"{provider}.stream_max_retries={retries}",
        # With these three, strace showed Codex connecting only to the model endpoint: plugins
        # sync with chatgpt.com and api.github.com, analytics go to ab.chatgpt.com, and
        # unbounded connection retries would make an unreachable endpoint retry forever.
        "features.plugins=false",
        "features.unbounded_connection_retries=false",
        "analytics.enabled=false",
        # Codex passes its whole environment to the commands it runs (0.163 default): keep the
        # key away from model-written commands. Codex itself still reads it for the provider.
        f"shell_environment_policy.exclude=[{toml_string(API_KEY_VARIABLE)}]",
    ]
    if endpoint.api_key is not None:
        overrides.append(f"{provider}.env_key={toml_string(API_KEY_VARIABLE)}")
    if request.bot.model:
        overrides.append(f"model={toml_string(request.bot.model)}")
    if request.bot.instructions:
        # Arrives as its own developer message part, after Codex's built-in instructions.
        overrides.append(f"developer_instructions={toml_string(request.bot.instructions)}")
    flags: list[str] = []
    for override in overrides:
        flags += ["-c", override]
    return flags


def toml_string(value: str) -> str:
    """`value` as a TOML basic string, which is how Codex parses each `-c` value.

    Escapes what TOML forbids raw in a basic string (quote, backslash, control characters and
    DEL); other characters, non-ASCII included, pass as they are. A lone surrogate (not valid
    UTF-8, so it could not be passed at all) becomes U+FFFD.
    """
    escaped: list[str] = []
    for char in value:
        code = ord(char)
        if char in ('"', "\\"):
            escaped.append("\\" + char)
        elif code < 0x20 or code == 0x7F:
            escaped.append(f"\\u{code:04x}")
        elif 0xD800 <= code <= 0xDFFF:
            escaped.append("\ufffd")
        else:
            escaped.append(char)
    return '"' + "".join(escaped) + '"'


# -- the stream ------------------------------------------------------------------------------


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


def _bounded(text: str) -> str:
    text = text.strip()
    if len(text) <= MAX_ERROR_CHARS:
        return text
    return text[: MAX_ERROR_CHARS - 1] + "…"


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
            error=_bounded(error),
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
