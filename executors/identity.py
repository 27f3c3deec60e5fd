"""A worker's identity follows its workspace root, so a restarted worker resumes its sessions.

The backend remembers which worker holds each native session's files by the worker id the
worker sends. Those files live under the workspace root (`.worker/<kind>/`), so the id is kept
there too, in `<root>/.baton/worker-id`: the first worker on a root makes one up and writes it;
every later worker on that root reads it back and is known to the backend by the same name.

One live worker serves a root. A worker holds an exclusive `flock` on `<root>/.baton/
worker.lock` for as long as it runs, and a second worker on the same root is refused with an
error naming the holder. The kernel drops the lock when its process ends, however it ends
(kill -9 included), so a crashed worker never blocks the next start. Telling two live workers
apart instead would hand the second a name of its own for the same files, and on a deploy whose
new process starts while the old one finishes its turns, that name would be a fresh one: the
very loss of sessions the kept id exists to prevent. A refused start exits 2 and is retried by
its supervisor once the old process has gone.

An explicit id (`--worker-id` / `BATON_WORKER_ID`) wins and becomes the root's kept id: the
sessions this worker records are then recorded under it, so a later start without an explicit
id goes on with it. The files are reached through the root's directory descriptor and never
through a symlink (a planted one is refused); the id is written beside its place and renamed
into it, so no reader ever sees half of one.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import re
import secrets
import socket
import stat
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path

from executors.config import ConfigurationError, valid_worker_id

IDENTITY_DIRECTORY = ".baton"
IDENTITY_FILE = "worker-id"
LOCK_FILE = "worker.lock"
_PARTIAL_SUFFIX = ".partial"
_MAX_FILE_BYTES = 4096
_HOST_LABEL = re.compile(r"[^A-Za-z0-9.-]+")


class RootInUse(ConfigurationError):
    """Another live worker serves this workspace root."""


class IdentitySource(StrEnum):
    """Where a worker's id came from."""

    KEPT = "kept"  # read back from the root: a restart
    CREATED = "created"  # the root had none: made up and kept
    EXPLICIT = "explicit"  # --worker-id / BATON_WORKER_ID, now kept in the root


@dataclass(frozen=True)
class WorkerIdentity:
    """The id a worker is known by, and the root it holds while it runs."""

    worker_id: str
    root: Path
    source: IdentitySource
    replaced: str | None = None  # the kept id an explicit one took the place of


@contextmanager
def claim_workspace_root(*, root: Path, explicit_worker_id: str | None) -> Iterator[WorkerIdentity]:
    """Hold `root` for this worker while the block runs, and say who the worker is.

    Raises RootInUse if another live worker holds the root, and ConfigurationError if the
    root's identity files are not what this module writes (a symlink, a non-regular file, an
    unreadable id).
    """
    directory = _identity_directory(root)
    try:
        lock = _locked(directory, root=root)
        try:
            identity = _identity(directory, root=root, explicit_worker_id=explicit_worker_id)
            _record_holder(lock, identity)
            yield identity
        finally:
            os.close(lock)  # the kernel would drop the lock anyway when the process ends
    finally:
        os.close(directory)


def _identity_directory(root: Path) -> int:
    """A descriptor of `<root>/.baton`, made if missing, never reached through a symlink."""
    where = root / IDENTITY_DIRECTORY
    try:
        root.mkdir(parents=True, exist_ok=True)
        root_fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError as error:
        raise ConfigurationError(f"cannot use the workspace root {root}: {error}") from None
    try:
        with suppress(FileExistsError):  # mkdir never follows a link: one there stays
            os.mkdir(IDENTITY_DIRECTORY, mode=0o700, dir_fd=root_fd)
        return os.open(
            IDENTITY_DIRECTORY,
            os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC,
            dir_fd=root_fd,
        )
    except OSError as error:
        if error.errno in (errno.ELOOP, errno.ENOTDIR):
            raise ConfigurationError(
                f"{where} is not a directory (a symlink?): the worker keeps its identity there "
                "and follows no link out of the workspace root; remove it"
            ) from None
        raise ConfigurationError(f"cannot use {where}: {error}") from None
    finally:
        os.close(root_fd)


def _open_regular(directory: int, name: str, flags: int, *, root: Path) -> int:
    """Open a file of `.baton` that must be a regular file with one link (never a symlink, a
    FIFO a reader would block on, or a hard link to a file elsewhere a write would change)."""
    where = root / IDENTITY_DIRECTORY / name
    try:
        fd = os.open(
            name, flags | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, 0o600, dir_fd=directory
        )
    except OSError as error:
        if error.errno == errno.ELOOP:
            raise ConfigurationError(
                f"{where} is a symlink: the worker follows no link out of the workspace root; "
                "remove it"
            ) from None
        raise
    status = os.fstat(fd)
    if not stat.S_ISREG(status.st_mode) or status.st_nlink != 1:
        os.close(fd)
        raise ConfigurationError(f"{where} is not a plain file the worker made; remove it")
    return fd


def _locked(directory: int, *, root: Path) -> int:
    """The lock file's descriptor, holding its exclusive lock; RootInUse if another has it."""
    try:
        lock = _open_regular(directory, LOCK_FILE, os.O_RDWR | os.O_CREAT, root=root)
    except OSError as error:
        where = root / IDENTITY_DIRECTORY / LOCK_FILE
        raise ConfigurationError(f"cannot open {where}: {error}") from None
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = _holder(lock)
        os.close(lock)
        raise RootInUse(
            f"the workspace root {root} is in use by {holder}: one worker serves a workspace "
            "root; stop that worker, or give this one its own --workspace-root "
            "(BATON_WORKSPACE_ROOT)"
        ) from None
    except BaseException:
        os.close(lock)
        raise
    os.ftruncate(lock, 0)  # a dead holder's record: until ours is written, the holder is unnamed
    return lock


def _holder(lock: int) -> str:
    """Who the lock file says holds it (what `_record_holder` wrote)."""
    try:
        record = json.loads(os.pread(lock, _MAX_FILE_BYTES, 0))
        return f"worker {record['worker_id']!r} (pid {int(record['pid'])} on {record['host']})"
    except (OSError, ValueError, KeyError, TypeError):
        return "another worker"  # it holds the lock but has not written its record yet


def _record_holder(lock: int, identity: WorkerIdentity) -> None:
    record = {"worker_id": identity.worker_id, "pid": os.getpid(), "host": socket.gethostname()}
    os.pwrite(lock, f"{json.dumps(record)}\n".encode(), 0)


def _identity(directory: int, *, root: Path, explicit_worker_id: str | None) -> WorkerIdentity:
    """Under the lock: the kept id, the explicit one (kept from now on), or a new one."""
    _remove_partials(directory)
    kept = _kept_worker_id(directory, root=root)
    if explicit_worker_id is not None:
        if explicit_worker_id != kept:
            _keep(directory, explicit_worker_id, root=root)
        return WorkerIdentity(
            worker_id=explicit_worker_id,
            root=root,
            source=IdentitySource.EXPLICIT,
            replaced=kept if kept != explicit_worker_id else None,
        )
    if kept is not None:
        return WorkerIdentity(worker_id=kept, root=root, source=IdentitySource.KEPT)
    created = new_worker_id()
    _keep(directory, created, root=root)
    return WorkerIdentity(worker_id=created, root=root, source=IdentitySource.CREATED)


def new_worker_id() -> str:
    """A name no other worker has: the host it was made on (for people reading the admin),
    and 48 random bits (hosts of containers are named alike, and renamed on every deploy)."""
    host = _HOST_LABEL.sub("-", socket.gethostname()).strip("-.")[:63] or "worker"
    return f"{host}-{secrets.token_hex(6)}"


def _kept_worker_id(directory: int, *, root: Path) -> str | None:
    where = root / IDENTITY_DIRECTORY / IDENTITY_FILE
    try:
        fd = _open_regular(directory, IDENTITY_FILE, os.O_RDONLY, root=root)
    except FileNotFoundError:
        return None
    except OSError as error:
        raise ConfigurationError(f"cannot read {where}: {error}") from None
    with os.fdopen(fd, "rb") as file:
        content = file.read(_MAX_FILE_BYTES + 1)
    try:
        worker_id = content.decode("utf-8").removesuffix("\n")
    except UnicodeDecodeError:
        worker_id = ""
    if len(content) > _MAX_FILE_BYTES or not valid_worker_id(worker_id):
        raise ConfigurationError(
            f"{where} holds no valid worker id: put one in it, or remove it for a new one "
            "(the sessions recorded under the old id then start afresh)"
        )
    return worker_id


def _keep(directory: int, worker_id: str, *, root: Path) -> None:
    """Write the id beside its place and rename it into it: a reader sees the old id or the
    new one, and a rename replaces whatever entry is there without following it."""
    partial = f"{IDENTITY_FILE}.{secrets.token_hex(8)}{_PARTIAL_SUFFIX}"
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        fd = os.open(partial, flags, 0o644, dir_fd=directory)
        try:
            with os.fdopen(fd, "wb") as file:
                file.write(f"{worker_id}\n".encode())
                file.flush()
                os.fsync(file.fileno())
            os.replace(partial, IDENTITY_FILE, src_dir_fd=directory, dst_dir_fd=directory)
        finally:
            with suppress(FileNotFoundError):
                os.unlink(partial, dir_fd=directory)
        os.fsync(directory)
    except OSError as error:
        raise ConfigurationError(
            f"cannot keep the worker id in {root / IDENTITY_DIRECTORY / IDENTITY_FILE}: {error}"
        ) from None


def _remove_partials(directory: int) -> None:
    """Ids half-written by a worker that died while writing (it held the lock, as we do)."""
    for name in os.listdir(directory):
        if name.startswith(f"{IDENTITY_FILE}.") and name.endswith(_PARTIAL_SUFFIX):
            with suppress(FileNotFoundError):
                os.unlink(name, dir_fd=directory)
