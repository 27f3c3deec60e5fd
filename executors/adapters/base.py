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
from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import ClassVar, Protocol, runtime_checkable

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

    def for_run(self) -> AbstractContextManager[ModelEndpoint]:
        """The endpoint one run is given, for as long as it runs: this one here; through the
        worker's credential proxy, one with a key of the run's own (`executors.credentials`)."""
        return nullcontext(self)


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
    # The task's own executor state for this kind, made afresh from the worker's template before
    # the run (`executors.homes`): its native sessions live here, `home/` is the executor's HOME.
    state_dir: Path
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
    # Written whole first; then stdin is closed, unless the run is `interactive`.
    stdin: bytes = field(repr=False)
    # An executor Baton keeps talking to while it runs (a JSON-RPC server, a stream-json
    # input): stdin stays open, its parser writes to it (`SteerableParser.attach`) and closes
    # it when the run's work is done.
    interactive: bool = False


class StreamParser(Protocol):
    """Per-run state machine over the executor's stdout lines."""

    def feed(self, line: str) -> list[Event]:
        """Events for one stdout line (without its newline); unknown lines give none."""

    def finish(self, *, exit_code: int, stderr_tail: str) -> Outcome:
        """The run's outcome once the process has exited with `exit_code`."""


class Stdin(Protocol):
    """A running executor's stdin, as its parser may use it (`ExecutorProcess` is one)."""

    def write_stdin(self, data: bytes) -> bool:
        """Queue `data` to be written after everything written before it; False once stdin
        is closed (the bytes are dropped). Never blocks on the executor reading."""

    def close_stdin(self) -> None:
        """Close stdin once everything queued is written (again: nothing)."""


class SteerRefusal(StrEnum):
    """Why a steer did not reach the running agent; the worker reports it and Baton falls back
    to queueing the message behind the turn (`enqueue`)."""

    NOT_STEERABLE = "not_steerable"  # this executor kind cannot take input while it runs
    FINISHED = "finished"  # the agent already made its last model call of the turn
    NOT_RUNNING = "not_running"  # no executor runs for the claim (not started, stopped, ended)
    REFUSED = "refused"  # the executor answered the steer with an error


@dataclass(frozen=True)
class SteerResult:
    """What became of one steer: delivered to the running agent, or refused and why."""

    delivered: bool
    refusal: SteerRefusal | None = None

    @classmethod
    def refused(cls, refusal: SteerRefusal) -> SteerResult:
        return cls(delivered=False, refusal=refusal)


@runtime_checkable
class SteerableParser(StreamParser, Protocol):
    """The parser of an interactive run (`Launch.interactive`): it writes to the executor's
    stdin as the run goes (replies, the next request, the end) and can steer the running turn."""

    def attach(self, stdin: Stdin) -> None:
        """Called once, right after the process started and before the first line is fed."""

    def steer(self, text: str, done: Callable[[SteerResult], None]) -> None:
        """Give `text` to the running turn as more user input. Called from another thread
        than `feed`; never blocks. `done` is called exactly once, from any thread, when the
        executor has taken it (`delivered`) or it cannot (`refused`), at the latest when the
        run ends. A text the agent received must reach its next model request."""


class ExecutorAdapter(ABC):
    kind: ClassVar[str]  # its name in `executors.kinds.KINDS`
    # Whether its runs are interactive and take more user input while they run (`steer`).
    steerable: ClassVar[bool] = False
    # The files of its native sessions in the state dir, kept from one run of a task to the
    # next (`executors.homes.HomeTemplate`); everything else there is removed before each run.
    session_files: ClassVar[tuple[str, ...]] = ()
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
