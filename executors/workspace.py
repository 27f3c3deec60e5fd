"""Task workspaces and the artifacts materialized in them.

Each task gets one directory, `<root>/<task_id>/`, reused across its turns, so an agent finds
the files it made on the previous turn. Before a run, every file of the dispatch manifest is
written at its workspace path (`.baton/artifacts/<id>.txt`, the transcript and the history files
under `.baton/history/`), sha256-checked, so the pointer lines in the prompt lead to the whole
text. A file already there with the right hash is kept (the same artifact is named on every
later turn). One artifact at several paths (a spilled turn's text is also its turn file; equal
turns share one artifact) is fetched once and copied.

A long task's manifest stays small (manifest version 2). Its transcript and turn index may be
composite files, the concatenation of parts in order, each part checked against its own
sha256. The turn files of its sealed history come in artifact lists: JSON documents, fetched and
expanded into more manifest entries. Parts and lists are kept in the workspace's cache,
`.baton/cache/`, under their sha256, so each is fetched once for the task; a composite file is
written again only when it no longer holds what its last assembly wrote (recorded under
`.baton/cache/composites/`, by the parts it was made of). A cached file no pass has used for an
hour is removed (a long task's newest part is new on every turn). A manifest version newer than
this worker knows is refused.

The worker never writes or deletes outside the workspace, whatever an agent planted in it.
A manifest path that would leave it — absolute, with `..`, or through a symlinked directory —
is refused: the turn fails. Every path, the lists' included, is checked before anything is
written at one, so a bad manifest writes nothing there (the lists it fetched stay in the
cache). This holds by construction, not by checking a path and then using it: every directory
is opened step by step with `O_NOFOLLOW` and every file is reached relative to its directory's
descriptor (`open_directory`), so a link swapped in meanwhile is not followed either. A file is
only ever written beside its place and renamed into it (`replacing`), which replaces a symlink
or a hard link found there instead of writing through it; a file counts as held only when it is
a regular file with one link (`open_held_file`); the cache sweep removes only regular files of
directories opened that way. The worker's other writes (executor state, session usage) use the
same functions.
"""

from __future__ import annotations

import errno
import hashlib
import os
import re
import shutil
import stat
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import BinaryIO

from pydantic import ValidationError

from executors.client import BackendClient, partial_beside
from executors.payloads import ArtifactEntry, ArtifactList, ArtifactPartRef

# The newest manifest form this worker lays out: 2 adds composite files and artifact lists.
MANIFEST_VERSION = 2
CACHE_DIRECTORY = ".baton/cache"
CACHE_FOLDERS = ("parts", "lists", "composites")
# How long a cached part, list or record nothing uses is kept (see `_Materializing.sweep_cache`).
CACHE_GRACE_SECONDS = 3600
_SHA256 = re.compile("[0-9a-f]{64}")
_DIRECTORY_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
# O_NONBLOCK: opening a FIFO planted at a file's place must not block the worker.
_HELD_FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
_PARTIAL_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


class ArtifactRefused(RuntimeError):
    """The manifest asked for something the worker will not do (a path outside the workspace)."""


# -- link-safe file operations (the one place the worker's writes and deletes go through) ----


def open_directory(base: Path | int, relative: str | PurePosixPath, *, create: bool) -> int:
    """A descriptor of the directory `relative` below `base`, each step opened without
    following a link; the steps are made first when `create`. The caller closes it.

    `base` (a path, or a descriptor the caller keeps) is the trusted anchor — the configured
    root — and is followed as given. Raises NotADirectoryError when a step is a symlink or a
    file (`O_NOFOLLOW | O_DIRECTORY`), FileNotFoundError when one is missing.
    """
    fd = os.dup(base) if isinstance(base, int) else os.open(base, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for part in PurePosixPath(relative).parts:
            if create:
                with suppress(FileExistsError):  # mkdir never follows a link: one there stays
                    os.mkdir(part, dir_fd=fd)
            child = os.open(part, _DIRECTORY_FLAGS, dir_fd=fd)
            os.close(fd)
            fd = child
    except BaseException:
        os.close(fd)
        raise
    return fd


def open_held_file(directory: int, name: str) -> int | None:
    """A read descriptor of `name` in `directory` if it is a regular file with one link, else
    None (missing, a symlink, a FIFO, a hard link to a file elsewhere that a later write by
    an agent would change): what the worker counts as a file it holds."""
    try:
        fd = os.open(name, _HELD_FILE_FLAGS, dir_fd=directory)
    except OSError:
        return None
    status = os.fstat(fd)
    if not stat.S_ISREG(status.st_mode) or status.st_nlink != 1:
        os.close(fd)
        return None
    os.set_blocking(fd, True)
    return fd


@contextmanager
def replacing(directory: int, name: str) -> Iterator[BinaryIO]:
    """A new file to write, renamed to `name` in `directory` when the block ends without an
    error (and removed otherwise). Never written through whatever is at `name`: the rename
    replaces the entry itself, so a planted symlink or hard link is replaced, never followed,
    and a reader sees the old file or the whole new one."""
    partial = partial_beside(Path(name)).name
    fd = os.open(partial, _PARTIAL_FLAGS, 0o644, dir_fd=directory)
    try:
        with os.fdopen(fd, "wb") as file:
            yield file
        os.replace(partial, name, src_dir_fd=directory, dst_dir_fd=directory)
    finally:
        with suppress(FileNotFoundError):
            os.unlink(partial, dir_fd=directory)


def descriptor_path(directory: int, name: str) -> Path:
    """A path to `name` in the directory `directory` is open on, for code that takes paths
    (the client's download): the kernel resolves `/proc/self/fd/<n>` to that very directory,
    wherever it is now, and never through a link swapped in on the way (Linux)."""
    return Path(f"/proc/self/fd/{directory}") / name


# -- workspaces ------------------------------------------------------------------------------


def task_workspace(*, root: Path, task_id: int) -> Path:
    """The task's directory under `root`, made if missing; ArtifactRefused if a link is there."""
    root.mkdir(parents=True, exist_ok=True)
    try:
        os.close(open_directory(root, str(task_id), create=True))
    except NotADirectoryError:
        raise ArtifactRefused(f"workspace {task_id} is a link or a file, not a directory") from None
    return root / str(task_id)


def _checked_relative(relative_path: str) -> PurePosixPath:
    posix = PurePosixPath(relative_path)
    if (
        not relative_path
        or "\x00" in relative_path
        or "\\" in relative_path
        or posix.is_absolute()
        or any(part in ("..", "") for part in relative_path.split("/"))
    ):
        raise ArtifactRefused(f"artifact path {relative_path!r} is not a path inside the workspace")
    return posix


def _refused_through_link(relative_path: str) -> ArtifactRefused:
    return ArtifactRefused(
        f"artifact path {relative_path!r} leads outside the workspace: one of its directories "
        "is a link or a file"
    )


def artifact_destination(*, workspace: Path, relative_path: str) -> Path:
    """Where a manifest path lands, its directories made (never through a link), or
    ArtifactRefused if it would leave the workspace."""
    posix = _checked_relative(relative_path)
    try:
        os.close(open_directory(workspace, posix.parent, create=True))
    except NotADirectoryError:
        raise _refused_through_link(relative_path) from None
    return workspace.joinpath(*posix.parts)


def materialize_artifacts(
    *,
    client: BackendClient,
    workspace: Path,
    manifest: Sequence[ArtifactEntry],
    artifact_lists: Sequence[ArtifactPartRef] = (),
    artifact_url_template: str = "",
    manifest_version: int = 1,
) -> int:
    """Write every manifest file into the workspace; returns how many downloads that took
    (artifacts, composite files' parts and artifact lists).

    All paths, the lists' included, are checked before anything is written at one, so a bad
    manifest writes nothing there.
    """
    if manifest_version > MANIFEST_VERSION:
        raise ArtifactRefused(
            f"this worker lays out manifest version {MANIFEST_VERSION} at most; the backend "
            f"sent {manifest_version}: upgrade the worker"
        )
    workspace.parent.mkdir(parents=True, exist_ok=True)  # the trusted root, as configured
    try:
        workspace_fd = open_directory(workspace.parent, workspace.name, create=True)
    except NotADirectoryError:
        raise ArtifactRefused("the workspace is a link or a file, not a directory") from None
    materializing = _Materializing(client=client, workspace=workspace_fd)
    try:
        placements = [materializing.placement(entry) for entry in manifest]
        if artifact_lists and "{id}" not in artifact_url_template:
            raise ArtifactRefused("the manifest has artifact lists but no artifact URL template")
        for listed in artifact_lists:
            placements += [
                materializing.placement(entry.entry(artifact_url_template=artifact_url_template))
                for entry in materializing.artifact_list(listed).files
            ]
        for placement in placements:
            if isinstance(placement, _Composite):
                materializing.assemble(placement)
            else:
                materializing.write(placement)
        materializing.sweep_cache()
    finally:
        materializing.close()
    return materializing.downloads


@dataclass(frozen=True)
class _Location:
    """A file's place: its path in the workspace, and its directory's descriptor and its name
    there (how it is reached)."""

    path: str
    directory: int = field(compare=False)
    name: str = field(compare=False)


@dataclass(frozen=True)
class _Plain:
    """A manifest entry and the checked place it goes to."""

    entry: ArtifactEntry
    destination: _Location


@dataclass(frozen=True)
class _Composite:
    """A composite file's entry and checked place, where the cache keeps each of its parts,
    and the record of its last assembly."""

    entry: ArtifactEntry
    destination: _Location
    parts: tuple[tuple[ArtifactPartRef, _Location], ...]
    record: _Location


@dataclass
class _Materializing:
    """One pass of `materialize_artifacts` over a workspace (open on `workspace`)."""

    client: BackendClient
    workspace: int
    downloads: int = 0
    # The directories opened (and made) in this pass, by workspace path: closed by `close`.
    directories: dict[PurePosixPath, int] = field(default_factory=dict)
    # A file checked (or fetched) in this pass for each sha256: a copy source.
    checked: dict[str, _Location] = field(default_factory=dict)
    # The cache files this pass read or wrote (parts, lists, assembly records).
    used: set[str] = field(default_factory=set)

    def close(self) -> None:
        for fd in self.directories.values():
            os.close(fd)
        self.directories.clear()
        os.close(self.workspace)

    def destination(self, relative_path: str) -> _Location:
        posix = _checked_relative(relative_path)
        directory = self.directories.get(posix.parent)
        if directory is None:
            try:
                directory = open_directory(self.workspace, posix.parent, create=True)
            except NotADirectoryError:
                raise _refused_through_link(relative_path) from None
            self.directories[posix.parent] = directory
        return _Location(path=str(posix), directory=directory, name=posix.name)

    def cache_path(self, folder: str, sha256: str, *, suffix: str = "") -> _Location:
        if _SHA256.fullmatch(sha256) is None:
            raise ArtifactRefused(f"{sha256!r} is not a sha256 the cache can file under")
        return self.destination(f"{CACHE_DIRECTORY}/{folder}/{sha256}{suffix}")

    def placement(self, entry: ArtifactEntry) -> _Plain | _Composite:
        destination = self.destination(entry.path)
        if entry.parts is None:
            return _Plain(entry=entry, destination=destination)
        total = sum(part.size_bytes for part in entry.parts)
        if total != entry.size_bytes:
            raise ArtifactRefused(
                f"composite artifact {entry.id!r} is {entry.size_bytes} bytes, but its parts "
                f"add up to {total}"
            )
        return _Composite(
            entry=entry,
            destination=destination,
            parts=tuple((part, self.cache_path("parts", part.sha256)) for part in entry.parts),
            record=self.cache_path("composites", _composite_key(entry.parts)),
        )

    def download(self, *, url: str, location: _Location, sha256: str) -> None:
        destination = descriptor_path(location.directory, location.name)
        self.client.download(url=url, destination=destination, sha256=sha256)
        self.downloads += 1

    def fetched(self, *, sha256: str, download_url: str, cache_path: _Location) -> _Location:
        """A file that holds the artifact with this sha256: one checked in this pass, else the
        cache's copy if its hash is right, else one downloaded into the cache."""
        source = self.checked.get(sha256)
        if source is None:
            # touch: in use, so `sweep_cache` keeps it (through the descriptor: the file itself)
            if _sha256_of(cache_path, touch=True) != sha256:
                self.download(url=download_url, location=cache_path, sha256=sha256)
            source = self.checked[sha256] = cache_path
        self.used.add(cache_path.path)
        return source

    def sweep_cache(self) -> None:
        """Remove the cached parts, lists and records this pass did not use and nothing has
        used for `CACHE_GRACE_SECONDS`: a long task's newest part changes on every turn, and
        its old copies would pile up. The grace spares what another run in the same
        workspace (a turn and a summary job) fetched a moment ago. Only regular files of the
        cache's own directories go: a link there (to a directory or a file) is never followed,
        nor removed."""
        cutoff = time.time() - CACHE_GRACE_SECONDS
        for folder in CACHE_FOLDERS:
            try:
                directory = open_directory(
                    self.workspace, f"{CACHE_DIRECTORY}/{folder}", create=False
                )
            except OSError:
                continue  # none yet, or not a directory of the workspace
            try:
                with os.scandir(directory) as entries:
                    stale = [
                        entry.name
                        for entry in entries
                        if entry.is_file(follow_symlinks=False)
                        and f"{CACHE_DIRECTORY}/{folder}/{entry.name}" not in self.used
                        and entry.stat(follow_symlinks=False).st_mtime <= cutoff
                    ]
                for name in stale:
                    with suppress(FileNotFoundError):  # removed by another run meanwhile
                        os.unlink(name, dir_fd=directory)
            finally:
                os.close(directory)

    def artifact_list(self, listed: ArtifactPartRef) -> ArtifactList:
        path = self.cache_path("lists", listed.sha256, suffix=".json")
        source = self.fetched(
            sha256=listed.sha256, download_url=listed.download_url, cache_path=path
        )
        try:
            return ArtifactList.model_validate_json(_read_held(source))
        except ValidationError as error:
            first = error.errors(include_url=False)[0]
            where = ".".join(str(step) for step in first["loc"])
            raise ArtifactRefused(
                f"artifact list {listed.id!r} is not a list of files ({where}: {first['msg']})"
            ) from None

    def write(self, placement: _Plain) -> None:
        entry, destination = placement.entry, placement.destination
        if _sha256_of(destination) == entry.sha256:
            self.checked.setdefault(entry.sha256, destination)
            return
        source = self.checked.get(entry.sha256)
        if source is None or not _copied(source=source, destination=destination):
            self.download(url=entry.download_url, location=destination, sha256=entry.sha256)
        self.checked[entry.sha256] = destination

    def assemble(self, placement: _Composite) -> None:
        """Write a composite file from its parts, beside its path and then renamed into place,
        unless it holds what its last assembly wrote (its entry's sha256 names the composite,
        not the file's bytes, so the record of that assembly is what it is checked against)."""
        entry, destination, record = placement.entry, placement.destination, placement.record
        self.used.add(record.path)
        assembled_sha256 = _recorded_sha256(record)
        if (
            assembled_sha256 is not None
            and _sha256_of(destination, size=entry.size_bytes) == assembled_sha256
        ):
            return
        sources = [
            self.fetched(sha256=part.sha256, download_url=part.download_url, cache_path=path)
            for part, path in placement.parts
        ]
        digest = hashlib.sha256()
        with replacing(destination.directory, destination.name) as file:
            for source in sources:
                with _held(source) as part:
                    for chunk in _chunks(part):
                        digest.update(chunk)
                        file.write(chunk)
            size = file.tell()
            if size != entry.size_bytes:
                raise ArtifactRefused(
                    f"composite artifact {entry.id!r} assembled to {size} bytes, not the "
                    f"{entry.size_bytes} of the manifest"
                )
        with replacing(record.directory, record.name) as file:
            file.write(f"{digest.hexdigest()}\n".encode())


def _composite_key(parts: Sequence[ArtifactPartRef]) -> str:
    """What a composite file's record is filed under: the parts it is made of, in order."""
    digest = hashlib.sha256()
    for part in parts:
        digest.update(f"{part.sha256}\n".encode())
    return digest.hexdigest()


@contextmanager
def _held(location: _Location) -> Iterator[BinaryIO]:
    """A held file (see `open_held_file`) open for reading; FileNotFoundError if it is not
    one now (an agent replaced a file this pass checked)."""
    fd = open_held_file(location.directory, location.name)
    if fd is None:
        raise FileNotFoundError(errno.ENOENT, "no longer a file the worker holds", location.path)
    with os.fdopen(fd, "rb") as file:
        yield file


def _read_held(location: _Location) -> bytes:
    with _held(location) as file:
        return file.read()


def _recorded_sha256(record: _Location) -> str | None:
    fd = open_held_file(record.directory, record.name)
    if fd is None:
        return None
    with os.fdopen(fd, "rb") as file:
        content = file.read(128)
    recorded = content.decode("ascii", errors="replace").strip()
    return recorded if _SHA256.fullmatch(recorded) else None


def _sha256_of(location: _Location, *, size: int | None = None, touch: bool = False) -> str | None:
    """The sha256 of the file held at `location` (None if it holds none, or one not of `size`
    bytes); `touch` sets its mtime to now."""
    fd = open_held_file(location.directory, location.name)
    if fd is None:
        return None
    with os.fdopen(fd, "rb") as file:
        if size is not None and os.fstat(fd).st_size != size:
            return None
        if touch:
            os.utime(fd)
        digest = hashlib.sha256()
        for chunk in _chunks(file):
            digest.update(chunk)
    return digest.hexdigest()


def _copied(*, source: _Location, destination: _Location) -> bool:
    """Copy a checked file beside `destination` and rename it into place, so a partial copy
    is never seen there (as a download is); False if the source is no longer held."""
    try:
        with _held(source) as original, replacing(destination.directory, destination.name) as copy:
            shutil.copyfileobj(original, copy, 1 << 20)
    except FileNotFoundError:
        return False
    return True


def _chunks(file: BinaryIO) -> Iterator[bytes]:
    return iter(lambda: file.read(1 << 20), b"")
