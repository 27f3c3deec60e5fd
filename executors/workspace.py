"""Task workspaces and the artifacts materialized in them.

Each task gets one directory, `<root>/<task_id>/`, reused across its turns, so an agent finds
the files it made on the previous turn. Before a run, every artifact of the dispatch manifest is
written at its workspace path (`.baton/artifacts/<id>.txt`, the transcript and the history files
under `.baton/history/`), sha256-checked, so the pointer lines in the prompt lead to the whole
text. A file already there with the right hash is kept (the same artifact is named on every
later turn). One artifact at several paths (a spilled turn's text is also its turn file; equal
turns share one artifact) is fetched once and copied. A manifest path that would leave the
workspace — absolute, with `..`, or through a symlink — is refused: the turn fails, nothing is
written.
"""

from __future__ import annotations

import hashlib
import shutil
from collections.abc import Sequence
from pathlib import Path, PurePosixPath

from executors.client import ArtifactEntry, BackendClient


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
    *, client: BackendClient, workspace: Path, manifest: Sequence[ArtifactEntry]
) -> int:
    """Write every manifest artifact into the workspace; returns how many were downloaded.

    All paths are checked before anything is downloaded, so a bad manifest writes nothing.
    """
    directories: set[Path] = set()
    destinations = [
        (
            entry,
            artifact_destination(
                workspace=workspace, relative_path=entry.path, checked_directories=directories
            ),
        )
        for entry in manifest
    ]
    downloaded = 0
    # A file checked (or fetched) in this pass for each sha256: a copy source.
    checked: dict[str, Path] = {}
    for entry, destination in destinations:
        if destination.is_file() and _sha256_of(destination) == entry.sha256:
            checked.setdefault(entry.sha256, destination)
            continue
        source = checked.get(entry.sha256)
        if source is not None:
            _copy(source=source, destination=destination)
        else:
            client.download(url=entry.download_url, destination=destination, sha256=entry.sha256)
            downloaded += 1
        checked[entry.sha256] = destination
    return downloaded


def _copy(*, source: Path, destination: Path) -> None:
    """Copy a checked file beside `destination` and rename it into place, so a partial copy
    is never seen there (as a download is)."""
    partial = destination.with_name(f".{destination.name}.partial")
    try:
        shutil.copyfile(source, partial)
        partial.replace(destination)
    finally:
        partial.unlink(missing_ok=True)


def _sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as file:
        for chunk in iter(lambda: file.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()
