"""Links planted in a workspace (by an agent's tool commands) never let the worker write or
delete outside it: the real materialization and cache sweep, run over symlinks and hard links
that point out of the workspace, leave everything outside as it was (content, mtime,
existence) and still lay the workspace out."""

from __future__ import annotations

import os
import stat
import time
from pathlib import Path

import pytest

from executors.adapters.session_usage import SessionUsageStore
from executors.workspace import (
    CACHE_GRACE_SECONDS,
    ArtifactRefused,
    materialize_artifacts,
    task_workspace,
)
from tests.executors import test_worker_parts
from tests.executors.test_worker_parts import (
    PART_TEXTS,
    TRANSCRIPT,
    _client,
    _composite,
    _entry,
    _materialize,
    _served,
    _turn,
)

backend = test_worker_parts.backend  # the loopback backend that serves the artifacts

OLD = time.time() - CACHE_GRACE_SECONDS - 600  # older than the sweep's grace period
ARTIFACT = ".baton/artifacts/a.txt"
ARTIFACT_TEXT = b"the whole text of an artifact\n" * 40


def _outside(tmp_path: Path, name: str = "outside") -> Path:
    """Files outside the workspace that look like a cache (old enough to be swept)."""
    outside = tmp_path / name
    outside.mkdir()
    for folder in ("parts", "lists", "composites"):
        (outside / folder).mkdir(parents=True)
        for n in range(2):
            (outside / folder / f"{n:064x}").write_bytes(b"not the worker's %d\n" % n)
    (outside / "secret.txt").write_bytes(PART_TEXTS[1])  # a part's bytes, by chance or design
    for path in outside.rglob("*"):
        os.utime(path, (OLD, OLD), follow_symlinks=False)
    return outside


def _snapshot(directory: Path) -> dict[str, tuple[int, bytes, int]]:
    """Every entry below `directory`: its type, its content (a link: its target), its mtime."""
    entries = {}
    for path in sorted(directory.rglob("*")):
        status = path.lstat()
        if stat.S_ISLNK(status.st_mode):
            content = os.readlink(path).encode()
        elif stat.S_ISREG(status.st_mode):
            content = path.read_bytes()
        else:
            content = b""
        entries[str(path.relative_to(directory))] = (
            stat.S_IFMT(status.st_mode),
            content,
            status.st_mtime_ns,
        )
    return entries


def _plain_turn_entry(backend) -> object:
    backend.files["/api/artifacts/a/content/"] = ARTIFACT_TEXT
    return _entry(ARTIFACT_TEXT, ARTIFACT, url="/api/artifacts/a/content/")


def _old_cache(workspace: Path) -> Path:
    """A real cache with an old part nothing uses: the sweep must still remove it."""
    stale = workspace / ".baton" / "cache" / "parts" / ("f" * 64)
    stale.parent.mkdir(parents=True, exist_ok=True)
    stale.write_bytes(b"an old part\n")
    os.utime(stale, (OLD, OLD))
    return stale


@pytest.mark.parametrize("planted", [".baton", ".baton/cache"])
def test_a_symlinked_cache_directory_is_not_swept(backend, tmp_path, planted):
    outside = _outside(tmp_path)
    _outside(outside, "cache")  # what `.baton/cache/<folder>` leads to through `.baton`
    before = _snapshot(outside)
    workspace = task_workspace(root=tmp_path / "root", task_id=1)
    if planted == ".baton/cache":
        (workspace / ".baton").mkdir()
    (workspace / planted).symlink_to(outside)

    # A turn with no artifacts still sweeps the cache.
    assert materialize_artifacts(client=_client(backend), workspace=workspace, manifest=[]) == 0
    assert _snapshot(outside) == before
    if planted == ".baton/cache":
        entry = _plain_turn_entry(backend)
        materialize_artifacts(client=_client(backend), workspace=workspace, manifest=[entry])
        assert (workspace / ARTIFACT).read_bytes() == ARTIFACT_TEXT
    # A long task's turn needs the cache: refused with a clear error, still nothing outside.
    turn = _turn(backend, artifacts=[_composite(TRANSCRIPT, [_served(backend, "p1", b"x\n")])])
    with pytest.raises(ArtifactRefused, match="leads outside the workspace"):
        _materialize(_client(backend), workspace, turn)
    assert _snapshot(outside) == before


@pytest.mark.parametrize("link", ["symlink", "hard link"])
def test_a_link_in_the_cache_is_neither_followed_nor_touched(backend, tmp_path, link):
    """A part's bytes are outside, linked in at the part's name: a cache hit through the link
    would set that file's mtime (and a symlink would have the worker read outside). A symlinked
    folder and a symlink to an old file are skipped by the sweep; the real cache is swept."""
    outside = _outside(tmp_path)
    workspace = task_workspace(root=tmp_path / "root", task_id=3)
    stale = _old_cache(workspace)
    (workspace / ".baton" / "cache" / "lists").symlink_to(outside / "lists")
    part = _served(backend, "p2", PART_TEXTS[1])
    cached = workspace / ".baton" / "cache" / "parts" / part["sha256"]
    if link == "symlink":
        cached.symlink_to(outside / "secret.txt")
    else:
        os.link(outside / "secret.txt", cached)
    planted = cached.parent / ("e" * 64)
    planted.symlink_to(outside / "parts" / f"{0:064x}")
    os.utime(planted, (OLD, OLD), follow_symlinks=False)
    before = _snapshot(outside)

    turn = _turn(backend, artifacts=[_composite(TRANSCRIPT, [part])])
    assert _materialize(_client(backend), workspace, turn) == 1  # fetched: a link is no hold
    assert (workspace / TRANSCRIPT).read_bytes() == PART_TEXTS[1]
    assert _snapshot(outside) == before
    assert cached.is_file() and not cached.is_symlink() and cached.stat().st_nlink == 1
    assert planted.is_symlink()  # skipped by the sweep: neither followed nor removed
    assert not stale.exists()


@pytest.mark.parametrize("link", ["symlink", "hard link"])
@pytest.mark.parametrize("at", ["artifact", "transcript"])
def test_a_link_at_a_files_path_is_replaced_and_not_written_through(backend, tmp_path, link, at):
    """A symlink (to a file of other bytes) is replaced, not written through; a hard link to
    a file holding the right bytes is replaced too, so that an agent's in-place edit of the
    workspace's file later cannot change the file outside."""
    outside = _outside(tmp_path)
    workspace = task_workspace(root=tmp_path / "root", task_id=3)
    if at == "artifact":
        path, expected = ARTIFACT, ARTIFACT_TEXT
        entry = _plain_turn_entry(backend)

        def materialize() -> None:
            materialize_artifacts(client=_client(backend), workspace=workspace, manifest=[entry])
    else:
        path, expected = TRANSCRIPT, PART_TEXTS[0] + PART_TEXTS[2]
        parts = [_served(backend, "p1", PART_TEXTS[0]), _served(backend, "p3", PART_TEXTS[2])]
        turn = _turn(backend, artifacts=[_composite(path, parts)])

        def materialize() -> None:
            _materialize(_client(backend), workspace, turn)

    materialize()  # an earlier turn laid it out (and recorded the assembly)
    target = workspace / path
    target.unlink()
    if link == "symlink":
        target.symlink_to(outside / "secret.txt")
    else:
        (outside / "same.txt").write_bytes(expected)
        os.link(outside / "same.txt", target)
    before = _snapshot(outside)

    materialize()
    assert _snapshot(outside) == before
    assert not target.is_symlink() and target.stat().st_nlink == 1
    assert target.read_bytes() == expected


def test_a_workspace_that_is_a_link_is_refused(tmp_path):
    outside = _outside(tmp_path)
    before = _snapshot(outside)
    root = tmp_path / "root"
    root.mkdir()
    (root / "5").symlink_to(outside)
    with pytest.raises(ArtifactRefused, match="link"):
        task_workspace(root=root, task_id=5)
    with pytest.raises(ArtifactRefused, match="link"):
        materialize_artifacts(client=None, workspace=root / "5", manifest=[])  # type: ignore[arg-type]
    assert _snapshot(outside) == before


SESSION = "0b7e4c1e-8a8f-4d55-9d43-6f0b9f2d1a11"


def test_session_usage_is_neither_written_nor_read_through_a_link(tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / f"{SESSION}.json").write_text('{"usage": {"input_tokens": 999}}')
    before = _snapshot(outside)
    state_dir = tmp_path / "state" / "codex"
    state_dir.mkdir(parents=True)
    (state_dir / "baton-thread-usage").symlink_to(outside)
    store = SessionUsageStore(state_dir, "baton-thread-usage")

    assert store.load(SESSION) is None
    store.save(SESSION, {"input_tokens": 11})
    assert _snapshot(outside) == before
    # A hard-linked record is not the worker's: not read, and replaced when saved.
    (state_dir / "baton-thread-usage").unlink()
    (state_dir / "baton-thread-usage").mkdir()
    record = state_dir / "baton-thread-usage" / f"{SESSION}.json"
    os.link(outside / f"{SESSION}.json", record)
    assert store.load(SESSION) is None
    store.save(SESSION, {"input_tokens": 11})
    assert store.load(SESSION) == {"input_tokens": 11}
    assert _snapshot(outside) == before
    assert record.stat().st_nlink == 1
