"""Executor homes: each task's executor state of its own, made afresh before and after every run.

An executor reads user-level configuration from its home — Codex from `CODEX_HOME`
(`config.toml`, `AGENTS.override.md`, `skills/`, `rules/`), Claude Code from `CLAUDE_CONFIG_DIR`
(`settings.json` with its hooks and `env`, `CLAUDE.md`, agents, commands, skills), and the shell
its commands run in from `HOME` (`~/.profile`, `~/.bashrc`) — and an agent's commands can write
there. So no home is shared: each task has one per executor kind,
`<state_root>/homes/<task_id>/<kind>/` (its `home/` is the executor's `HOME`), and before every
run the worker makes it afresh from its template (and again after it, so an idle home holds
only session files). The template is the worker's own, in code, so
no run can write it: an empty directory, plus only the files of the executor's native sessions
that the task's own earlier runs wrote there (`HomeTemplate.session_files`: Codex's rollouts,
Claude Code's session transcripts, Agno's session dbs, Baton's usage records), so a resumed
session finds what its task wrote and nothing else. Everything else — whatever a run wrote or
planted — is removed and `HOME` is emptied. What the worker itself configures comes from the
command line, the environment and the run's tmp dir, never from a file left in a home.

Runs of one home are one at a time on this worker (`TaskHome.held`): making it afresh must not
pull the files from under a run still using them. A summary job has a home apart from its task's
turns (`home_name`), so the two run side by side as before.

Removal is link-safe like every write of the worker (`workspace.open_directory`): no link is
followed, a link found where a directory of the home should be is removed, and a session file
kept is a regular file or a directory: a link, FIFO or device among them is removed too.
"""

from __future__ import annotations

import fnmatch
import os
import shutil
import stat
import threading
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from executors.workspace import open_directory

HOMES_DIRECTORY = "homes"
HOME_DIRECTORY = "home"  # the executor's HOME, inside its state directory
_DIRECTORY_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


@dataclass(frozen=True)
class HomeTemplate:
    """What an executor's home holds when a run starts: an empty `home/` (HOME) and only the
    session files of the task's earlier runs, named by `session_files`: patterns of paths
    relative to the state directory, one `fnmatch` pattern per path segment (`*` never crosses
    a `/`). A directory a pattern names whole is kept with all it holds."""

    session_files: tuple[str, ...] = ()

    def keeps(self, parts: tuple[str, ...]) -> bool:
        """Whether the entry at `parts` is a session file (or directory) kept whole."""
        return any(_matches(pattern, parts) for pattern in self._patterns())

    def descends(self, parts: tuple[str, ...]) -> bool:
        """Whether something below the directory at `parts` may be kept."""
        return any(
            len(pattern) > len(parts) and _matches(pattern[: len(parts)], parts)
            for pattern in self._patterns()
        )

    def _patterns(self) -> list[tuple[str, ...]]:
        return [PurePosixPath(pattern).parts for pattern in self.session_files]


def _matches(pattern: tuple[str, ...], parts: tuple[str, ...]) -> bool:
    return len(pattern) == len(parts) and all(
        fnmatch.fnmatchcase(part, glob) for part, glob in zip(parts, pattern, strict=True)
    )


def home_name(*, kind: str, job: str) -> str:
    """The home's directory name under its task: the executor kind for turns, with the job's
    kind beside it for other jobs (a summary job runs beside its task's turn)."""
    return kind if job == "turn" else f"{kind}-{job}"


# Each home's lock and how many runs hold or wait for it: dropped when none does.
_locks: dict[Path, tuple[threading.Lock, int]] = {}
_locks_guard = threading.Lock()


@dataclass(frozen=True)
class TaskHome:
    """One task's executor state for one executor kind (and job kind, `home_name`):
    `<state_root>/homes/<task_id>/<name>/`."""

    state_root: Path
    task_id: int
    name: str
    template: HomeTemplate

    @property
    def path(self) -> Path:
        return self.state_root / HOMES_DIRECTORY / str(self.task_id) / self.name

    @contextmanager
    def held(self) -> Iterator[None]:
        """Held while a run makes the home afresh and uses it: one run of a home at a time
        on this worker (one live worker serves a workspace root)."""
        path = self.path
        with _locks_guard:
            lock, users = _locks.get(path, (threading.Lock(), 0))
            _locks[path] = (lock, users + 1)
        try:
            with lock:
                yield
        finally:
            with _locks_guard:
                users = _locks[path][1] - 1
                if users:
                    _locks[path] = (lock, users)
                else:
                    del _locks[path]

    def make_afresh(self) -> Path:
        """The home, made afresh from the template (see the module doc): only the session
        files stay, and HOME is empty. Hold `held()` meanwhile."""
        self.state_root.mkdir(parents=True, exist_ok=True)
        root = os.open(self.state_root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            homes = _directory(root, HOMES_DIRECTORY)
            try:
                task = _directory(homes, str(self.task_id))
                try:
                    state = _directory(task, self.name)
                    try:
                        _prune(state, (), self.template)
                        _remove(state, HOME_DIRECTORY)
                        os.mkdir(HOME_DIRECTORY, 0o700, dir_fd=state)
                    finally:
                        os.close(state)
                finally:
                    os.close(task)
            finally:
                os.close(homes)
        finally:
            os.close(root)
        return self.path


def _directory(parent: int, name: str) -> int:
    """`name` in `parent` as a directory of its own: made if missing; a link, file or
    anything else found there is removed first, never followed."""
    try:
        return open_directory(parent, name, create=True)
    except NotADirectoryError:
        _remove(parent, name)
        return open_directory(parent, name, create=True)


def _prune(directory: int, parts: tuple[str, ...], template: HomeTemplate) -> None:
    """Remove every entry below `directory` (at `parts` in the home) the template does not keep."""
    for name in os.listdir(directory):
        entry = (*parts, name)
        mode = os.stat(name, dir_fd=directory, follow_symlinks=False).st_mode
        if stat.S_ISDIR(mode):
            keeps = template.keeps(entry)
            if keeps or template.descends(entry):
                child = os.open(name, _DIRECTORY_FLAGS, dir_fd=directory)
                try:
                    if keeps:
                        _only_files(child)
                    else:
                        _prune(child, entry, template)
                finally:
                    os.close(child)
                continue
        elif stat.S_ISREG(mode) and template.keeps(entry):
            continue
        _remove(directory, name)


def _only_files(directory: int) -> None:
    """Remove everything below `directory` but regular files and directories (links, FIFOs,
    sockets, devices): what a kept session directory may hold."""
    for name in os.listdir(directory):
        mode = os.stat(name, dir_fd=directory, follow_symlinks=False).st_mode
        if stat.S_ISDIR(mode):
            child = os.open(name, _DIRECTORY_FLAGS, dir_fd=directory)
            try:
                _only_files(child)
            finally:
                os.close(child)
        elif not stat.S_ISREG(mode):
            _remove(directory, name)


def _remove(directory: int, name: str) -> None:
    """Remove `name` in `directory`, whatever it is, following no link."""
    try:
        mode = os.stat(name, dir_fd=directory, follow_symlinks=False).st_mode
    except FileNotFoundError:
        return
    if stat.S_ISDIR(mode):
        # rmtree with dir_fd neither follows nor removes a link in its place.
        shutil.rmtree(name, dir_fd=directory)
    else:
        with suppress(FileNotFoundError):
            os.unlink(name, dir_fd=directory)
