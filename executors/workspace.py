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

A manifest path that would leave the workspace — absolute, with `..`, or through a symlink — is
refused: the turn fails. Every path, the lists' included, is checked before anything is written
at one, so a bad manifest writes nothing there (the lists it fetched stay in the cache).
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import BinaryIO

from pydantic import ValidationError

from executors.client import (
    ArtifactEntry,
    ArtifactList,
    ArtifactPartRef,
    BackendClient,
    partial_beside,
)

# The newest manifest form this worker lays out: 2 adds composite files and artifact lists.
MANIFEST_VERSION = 2
CACHE_DIRECTORY = ".baton/cache"
# How long a cached part, list or record nothing uses is kept (see `_Materializing.sweep_cache`).
CACHE_GRACE_SECONDS = 3600
_SHA256 = re.compile("[0-9a-f]{64}")


class ArtifactRefused(RuntimeError):
    """The manifest asked for something the worker will not do (a path outside the workspace)."""


def task_workspace(*, root: Path, task_id: int) -> Path:
    workspace = root / str(task_id)
    workspace.mkdir(parents=True, exist_ok=True)
    return workspace


def artifact_destination(
    *, workspace: Path, relative_path: str, checked_directories: set[Path] | None = None
) -> Path:
    """Where a manifest path lands, or ArtifactRefused if it would leave the workspace.

    `checked_directories` holds the directories one pass has already checked and made (it
    adds this one): a manifest of thousands of turn files shares a few directories, and
    nothing else writes the workspace while the worker prepares it.
    """
    posix = PurePosixPath(relative_path)
    if (
        not relative_path
        or "\x00" in relative_path
        or "\\" in relative_path
        or posix.is_absolute()
        or any(part in ("..", "") for part in relative_path.split("/"))
    ):
        raise ArtifactRefused(f"artifact path {relative_path!r} is not a path inside the workspace")
    destination = workspace.joinpath(*posix.parts)
    # A symlink planted in the workspace (by an earlier run) must not redirect the write.
    # Checked before the directories are made (mkdir would follow the link) and again after.
    parent = destination.parent
    if checked_directories is None or parent not in checked_directories:
        root = workspace.resolve()
        for _ in range(2):
            if not parent.resolve().is_relative_to(root):
                raise ArtifactRefused(
                    f"artifact path {relative_path!r} leads outside the workspace"
                )
            parent.mkdir(parents=True, exist_ok=True)
        if checked_directories is not None:
            checked_directories.add(parent)
    if destination.is_symlink():
        raise ArtifactRefused(f"artifact path {relative_path!r} leads outside the workspace")
    return destination


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
    materializing = _Materializing(client=client, workspace=workspace)
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
    return materializing.downloads


@dataclass(frozen=True)
class _Plain:
    """A manifest entry and the checked path it goes to."""

    entry: ArtifactEntry
    destination: Path


@dataclass(frozen=True)
class _Composite:
    """A composite file's entry and checked path, where the cache keeps each of its parts,
    and the record of its last assembly."""

    entry: ArtifactEntry
    destination: Path
    parts: tuple[tuple[ArtifactPartRef, Path], ...]
    record: Path


@dataclass
class _Materializing:
    """One pass of `materialize_artifacts` over a workspace."""

    client: BackendClient
    workspace: Path
    downloads: int = 0
    # The directories checked (and made) in this pass: see `artifact_destination`.
    directories: set[Path] = field(default_factory=set)
    # A file checked (or fetched) in this pass for each sha256: a copy source.
    checked: dict[str, Path] = field(default_factory=dict)
    # The cache files this pass read or wrote (parts, lists, assembly records).
    used: set[Path] = field(default_factory=set)

    def destination(self, relative_path: str) -> Path:
        return artifact_destination(
            workspace=self.workspace,
            relative_path=relative_path,
            checked_directories=self.directories,
        )

    def cache_path(self, folder: str, sha256: str, *, suffix: str = "") -> Path:
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

    def fetched(self, *, sha256: str, download_url: str, cache_path: Path) -> Path:
        """A file that holds the artifact with this sha256: one checked in this pass, else the
        cache's copy if its hash is right, else one downloaded into the cache."""
        source = self.checked.get(sha256)
        if source is None:
            if cache_path.is_file() and _sha256_of(cache_path) == sha256:
                os.utime(cache_path)  # in use: `sweep_cache` keeps it
            else:
                self.client.download(url=download_url, destination=cache_path, sha256=sha256)
                self.downloads += 1
            source = self.checked[sha256] = cache_path
        self.used.add(cache_path)
        return source

    def sweep_cache(self) -> None:
        """Remove the cached parts, lists and records this pass did not use and nothing has
        used for `CACHE_GRACE_SECONDS`: a long task's newest part changes on every turn, and
        its old copies would pile up. The grace spares what another run in the same
        workspace (a turn and a summary job) fetched a moment ago."""
        used = {path.resolve() for path in self.used}
        cutoff = time.time() - CACHE_GRACE_SECONDS
        for folder in ("parts", "lists", "composites"):
            directory = self.workspace / CACHE_DIRECTORY / folder
            if not directory.is_dir() or directory.is_symlink():
                continue
            for path in directory.iterdir():
                try:
                    if path.resolve() in used or path.lstat().st_mtime > cutoff:
                        continue
                    path.unlink()
                except OSError:
                    continue  # removed by another run meanwhile

    def artifact_list(self, listed: ArtifactPartRef) -> ArtifactList:
        path = self.cache_path("lists", listed.sha256, suffix=".json")
        source = self.fetched(
            sha256=listed.sha256, download_url=listed.download_url, cache_path=path
        )
        try:
            return ArtifactList.model_validate_json(source.read_bytes())
        except ValidationError as error:
            first = error.errors(include_url=False)[0]
            where = ".".join(str(step) for step in first["loc"])
            raise ArtifactRefused(
                f"artifact list {listed.id!r} is not a list of files ({where}: {first['msg']})"
            ) from None

    def write(self, placement: _Plain) -> None:
        entry, destination = placement.entry, placement.destination
        if destination.is_file() and _sha256_of(destination) == entry.sha256:
            self.checked.setdefault(entry.sha256, destination)
            return
        source = self.checked.get(entry.sha256)
        if source is not None:
            _copy(source=source, destination=destination)
        else:
            self.client.download(
                url=entry.download_url, destination=destination, sha256=entry.sha256
            )
            self.downloads += 1
        self.checked[entry.sha256] = destination

    def assemble(self, placement: _Composite) -> None:
        """Write a composite file from its parts, beside its path and then renamed into place,
        unless it holds what its last assembly wrote (its entry's sha256 names the composite,
        not the file's bytes, so the record of that assembly is what it is checked against)."""
        entry, destination, record = placement.entry, placement.destination, placement.record
        self.used.add(record)
        assembled_sha256 = _recorded_sha256(record)
        if (
            assembled_sha256 is not None
            and destination.is_file()
            and destination.stat().st_size == entry.size_bytes
            and _sha256_of(destination) == assembled_sha256
        ):
            return
        sources = [
            self.fetched(sha256=part.sha256, download_url=part.download_url, cache_path=path)
            for part, path in placement.parts
        ]
        digest = hashlib.sha256()
        partial = partial_beside(destination)
        try:
            with partial.open("wb") as file:
                for source in sources:
                    with source.open("rb") as part:
                        for chunk in _chunks(part):
                            digest.update(chunk)
                            file.write(chunk)
            size = partial.stat().st_size
            if size != entry.size_bytes:
                raise ArtifactRefused(
                    f"composite artifact {entry.id!r} assembled to {size} bytes, not the "
                    f"{entry.size_bytes} of the manifest"
                )
            partial.replace(destination)
        finally:
            partial.unlink(missing_ok=True)
        _write_atomically(record, f"{digest.hexdigest()}\n".encode())


def _composite_key(parts: Sequence[ArtifactPartRef]) -> str:
    """What a composite file's record is filed under: the parts it is made of, in order."""
    digest = hashlib.sha256()
    for part in parts:
        digest.update(f"{part.sha256}\n".encode())
    return digest.hexdigest()


def _recorded_sha256(record: Path) -> str | None:
    try:
        recorded = record.read_text(encoding="ascii").strip()
    except (OSError, UnicodeDecodeError):
        return None
    return recorded if _SHA256.fullmatch(recorded) else None


def _write_atomically(path: Path, content: bytes) -> None:
    partial = partial_beside(path)
    try:
        partial.write_bytes(content)
        partial.replace(path)
    finally:
        partial.unlink(missing_ok=True)


def _copy(*, source: Path, destination: Path) -> None:
    """Copy a checked file beside `destination` and rename it into place, so a partial copy
    is never seen there (as a download is)."""
    partial = partial_beside(destination)
    try:
        shutil.copyfile(source, partial)
        partial.replace(destination)
    finally:
        partial.unlink(missing_ok=True)


def _sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as file:
        for chunk in _chunks(file):
            digest.update(chunk)
    return digest.hexdigest()


def _chunks(file: BinaryIO) -> Iterator[bytes]:
    return iter(lambda: file.read(1 << 20), b"")
