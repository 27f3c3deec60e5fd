"""The interface every executor adapter implements: prepare → run → normalized events → outcome.

An adapter is stateless between runs. At worker start `locate()` finds the executor once (a
missing one stops the worker with a clear message). For each run, `launch()` returns the exact
command line, the whole environment, the working directory and the bytes for stdin — the prompt
always travels on stdin, never as an argument (Linux refuses one argument of 128 KiB or more).
The worker starts that process, feeds each stdout line to the run's `StreamParser`, and asks it
for the `Outcome` when the process has exited.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar, Protocol

from executors.events import Event, Outcome

# The longest error text an adapter reports of a failed run.
MAX_ERROR_CHARS = 4000


def bounded_error(text: str) -> str:
    """At most MAX_ERROR_CHARS of `text`, keeping its start (where an executor says what
    failed)."""
    text = text.strip()
    if len(text) <= MAX_ERROR_CHARS:
        return text
    return text[: MAX_ERROR_CHARS - 1] + "…"


class ExecutorUnavailable(RuntimeError):
    """The executor this worker was asked to serve is not installed or cannot run here."""


@dataclass(frozen=True)
class ModelEndpoint:
    """Where an executor's model calls go. None means the provider's own default."""

    base_url: str | None = None
    api_key: str | None = field(default=None, repr=False)
    # Retries inside the executor for one model call; Baton retries whole turns itself.
    max_retries: int = 2


@dataclass(frozen=True)
class BotConfig:
    """The bot settings the dispatch payload carries (`bot_config`)."""

    name: str
    model: str = ""  # empty: the executor's default model
    instructions: str = ""  # the bot's system prompt
    permission_mode: str = "full_access"  # "full_access" or "read_only"
    max_turns: int | None = None
    timeout_seconds: int = 1800


@dataclass(frozen=True)
class RunRequest:
    """Everything one run needs, prepared by the worker."""

    prompt: str
    bot: BotConfig
    workspace: Path  # the task's workspace: the executor's working directory
    state_dir: Path  # this worker's private home for this executor kind (native sessions live here)
    tmp_dir: Path  # a private, empty temporary directory for this run only
    endpoint: ModelEndpoint
    resume_session_id: str | None = None
    # Variables the worker passes through to every executor (PATH, locale, TZ, CA bundle):
    # adapters start from these and add their own, never from the worker's whole environment.
    passthrough_env: Mapping[str, str] = field(default_factory=dict, repr=False)


@dataclass(frozen=True)
class Launch:
    argv: list[str]
    env: dict[str, str] = field(repr=False)  # the complete environment of the process
    cwd: Path
    stdin: bytes = field(repr=False)  # written whole, then stdin is closed


class StreamParser(Protocol):
    """Per-run state machine over the executor's stdout lines."""

    def feed(self, line: str) -> list[Event]:
        """Events for one stdout line (without its newline); unknown lines give none."""

    def finish(self, *, exit_code: int, stderr_tail: str) -> Outcome:
        """The run's outcome once the process has exited with `exit_code`."""


class ExecutorAdapter(ABC):
    kind: ClassVar[str]  # its name in `executors.kinds.KINDS`
    _located: str | None = None

    def locate(self) -> str:
        """The executor (binary path or interpreter), found once per adapter; ExecutorUnavailable
        if it is absent."""
        if self._located is None:
            self._located = self._find()
        return self._located

    @abstractmethod
    def _find(self) -> str:
        """Look the executor up (called once, by `locate`)."""

    @abstractmethod
    def launch(self, request: RunRequest) -> Launch:
        """The process to start for this run."""

    @abstractmethod
    def parser(self, request: RunRequest) -> StreamParser:
        """A fresh parser for this run's stdout."""

    def missing_session(self, outcome: Outcome) -> bool:
        """Whether a resumed run failed because this machine has no such session (it lives on
        another worker, or its files are gone); the worker then runs fresh. Executors that
        Baton does not resume never say so."""
        return False
