"""A worker's identity follows its workspace root (`executors.identity`).

What is about processes runs in real ones: the worker itself (`python -m executors --once`
against a loopback stand-in for Baton's dispatch API, which records the worker id each
dispatch names) and small holder processes that take a root and keep it until told to let go
or killed with SIGKILL.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import dataclass
from functools import cached_property
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from executors.config import ConfigurationError, load_settings, valid_worker_id
from executors.identity import (
    IdentitySource,
    RootInUse,
    claim_workspace_root,
    new_worker_id,
)

REPO_ROOT = Path(__file__).resolve().parents[2]
IDLE = json.dumps({"turns": [], "next_ready_in_seconds": None}).encode()

# Takes the root named by argv[1] (with the explicit id argv[2], if any), prints what it is
# known by, and holds the root until its stdin closes.
HOLDER = """
import json, sys
from pathlib import Path
from executors.config import ConfigurationError
from executors.identity import claim_workspace_root
try:
    with claim_workspace_root(
        root=Path(sys.argv[1]), explicit_worker_id=(sys.argv[2:] or [None])[0]
    ) as identity:
        print(json.dumps({"worker_id": identity.worker_id}), flush=True)
        sys.stdin.read()
except ConfigurationError as error:
    print(json.dumps({"refused": str(error)}), flush=True)
"""


class _Dispatch(BaseHTTPRequestHandler):
    """Baton's dispatch API with nothing pending: records each body, answers idle."""

    def log_message(self, format: str, *args: object) -> None:
        pass

    def do_POST(self) -> None:  # noqa: N802 - http.server's naming
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self.server.bodies.append(json.loads(body))  # type: ignore[attr-defined]
        self.send_response(200)
        self.send_header("Content-Length", str(len(IDLE)))
        self.end_headers()
        self.wfile.write(IDLE)


@pytest.fixture
def dispatch_api() -> Iterator[ThreadingHTTPServer]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Dispatch)
    server.bodies = []  # type: ignore[attr-defined]
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


@dataclass
class Run:
    code: int
    stderr: str
    worker_ids: list[str]  # as the worker's dispatches named it


def run_worker(server: ThreadingHTTPServer, root: Path, **env: str) -> Run:
    """`python -m executors --once` on `root`: it dispatches once, finds nothing, exits."""
    host, port = server.server_address[:2]
    seen = len(server.bodies)  # type: ignore[attr-defined]
    finished = subprocess.run(  # noqa: S603
        [sys.executable, "-m", "executors", "--once", "--kinds", "codex"],
        cwd=REPO_ROOT,
        env={
            "PATH": os.environ["PATH"],
            "PYTHONPATH": str(REPO_ROOT),
            "BATON_URL": f"http://{host}:{port}",
            "BATON_WORKER_TOKEN": "t0k",
            "BATON_WORKSPACE_ROOT": str(root),
            "OPENAI_API_KEY": "sk-unused",
            **env,
        },
        capture_output=True,
        text=True,
        timeout=120,
    )
    bodies = server.bodies[seen:]  # type: ignore[attr-defined]
    return Run(finished.returncode, finished.stderr, [body["worker_id"] for body in bodies])


class Holder:
    """A process holding a workspace root (see HOLDER)."""

    def __init__(self, root: Path, explicit_worker_id: str | None = None) -> None:
        self.process = subprocess.Popen(  # noqa: S603
            [sys.executable, "-c", HOLDER, str(root), *filter(None, [explicit_worker_id])],
            cwd=REPO_ROOT,
            env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )

    @cached_property
    def said(self) -> dict[str, str]:
        """What it is known by, or why it was refused; it has taken the root once it says so."""
        assert self.process.stdout is not None
        return json.loads(self.process.stdout.readline())

    def let_go(self) -> None:
        assert self.said  # it got as far as taking the root, or being refused
        assert self.process.stdin is not None
        self.process.stdin.close()
        assert self.process.wait(timeout=30) == 0

    def kill(self) -> None:
        self.process.send_signal(signal.SIGKILL)
        assert self.process.wait(timeout=30) == -signal.SIGKILL


def kept_id(root: Path) -> str:
    return (root / ".baton" / "worker-id").read_text(encoding="utf-8").removesuffix("\n")


# --- across processes ------------------------------------------------------------------------


def test_a_restarted_worker_is_known_by_the_same_id(dispatch_api, tmp_path):
    root = tmp_path / "workspaces"
    first = run_worker(dispatch_api, root)
    second = run_worker(dispatch_api, root)
    assert (first.code, second.code) == (0, 0), first.stderr + second.stderr
    assert first.worker_ids == second.worker_ids == [kept_id(root)]
    # Another root is another worker.
    other = run_worker(dispatch_api, tmp_path / "other")
    assert other.worker_ids != first.worker_ids


def test_a_second_worker_on_a_held_root_is_refused_naming_the_holder(dispatch_api, tmp_path):
    root = tmp_path / "workspaces"
    holder = Holder(root)
    assert "worker_id" in holder.said
    try:
        refused = run_worker(dispatch_api, root)
        beside = run_worker(dispatch_api, tmp_path / "beside")  # another root: no trouble
    finally:
        holder.let_go()
    assert refused.code == 2
    assert refused.worker_ids == []  # it never asked the backend for work
    assert f"the workspace root {root.resolve()} is in use by worker" in refused.stderr
    assert f"{holder.said['worker_id']!r} (pid {holder.process.pid} on " in refused.stderr
    assert (beside.code, len(beside.worker_ids)) == (0, 1)
    # Once the holder has gone, a worker takes the root and its id.
    after = run_worker(dispatch_api, root)
    assert (after.code, after.worker_ids) == (0, [holder.said["worker_id"]])


def test_of_workers_starting_at_once_on_a_new_root_one_holds_it(tmp_path):
    root = tmp_path / "workspaces"
    with ExitStack() as stack:
        holders = [Holder(root) for _ in range(3)]  # all started before any is heard from
        for holder in holders:
            stack.callback(holder.let_go)
        held = [holder.said["worker_id"] for holder in holders if "worker_id" in holder.said]
        refusals = [holder.said["refused"] for holder in holders if "refused" in holder.said]
    assert held == [kept_id(root)]
    assert len(refusals) == 2
    # One refused before the holder had written its name is told of "another worker".
    named = (f"in use by worker {held[0]!r}", "in use by another worker")
    assert all(any(words in refusal for words in named) for refusal in refusals)


def test_a_killed_workers_root_is_taken_by_the_next_start(dispatch_api, tmp_path):
    root = tmp_path / "workspaces"
    crashed = Holder(root)
    assert "worker_id" in crashed.said
    crashed.kill()  # SIGKILL: nothing of the worker's own runs, the kernel drops its lock
    restarted = run_worker(dispatch_api, root)
    assert restarted.code == 0, restarted.stderr
    assert restarted.worker_ids == [crashed.said["worker_id"]]


def test_an_explicit_id_wins_and_is_kept_for_the_next_start(dispatch_api, tmp_path):
    root = tmp_path / "workspaces"
    assert run_worker(dispatch_api, root).code == 0
    generated = kept_id(root)
    explicit = run_worker(dispatch_api, root, BATON_WORKER_ID="demo-worker")
    assert explicit.worker_ids == ["demo-worker"]
    assert '"replaced": "' + generated + '"' in explicit.stderr
    # The sessions it recorded are under demo-worker now: a plain restart goes on with it.
    assert run_worker(dispatch_api, root).worker_ids == ["demo-worker"]
    assert run_worker(dispatch_api, root, BATON_WORKER_ID="demo-worker").worker_ids == [
        "demo-worker"
    ]
    assert kept_id(root) == "demo-worker"


def test_an_explicit_id_does_not_let_a_second_worker_share_the_root(tmp_path):
    root = tmp_path / "workspaces"
    holder = Holder(root, "worker-a")
    assert holder.said == {"worker_id": "worker-a"}
    try:
        second = Holder(root, "worker-b")
        assert "in use by worker 'worker-a'" in second.said["refused"]
        second.let_go()
    finally:
        holder.let_go()
    assert kept_id(root) == "worker-a"


# --- in one process --------------------------------------------------------------------------


def test_a_root_is_held_until_the_claim_ends(tmp_path):
    with claim_workspace_root(root=tmp_path, explicit_worker_id=None) as first:
        assert first.source is IdentitySource.CREATED
        # Another open of the lock file is another claim, even in the same process.
        with (
            pytest.raises(RootInUse, match=f"in use by worker {first.worker_id!r}"),
            claim_workspace_root(root=tmp_path, explicit_worker_id=None),
        ):
            pass
    with claim_workspace_root(root=tmp_path, explicit_worker_id=None) as again:
        assert (again.worker_id, again.source) == (first.worker_id, IdentitySource.KEPT)


@pytest.mark.parametrize("planted", [".baton", ".baton/worker-id", ".baton/worker.lock"])
def test_a_planted_symlink_is_refused_and_nothing_is_written_through_it(tmp_path, planted):
    root, outside = tmp_path / "root", tmp_path / "outside"
    root.mkdir()
    outside.mkdir()
    target = outside / "target"
    target.write_text("theirs\n")
    if planted != ".baton":
        (root / ".baton").mkdir()
    (root / planted).symlink_to(outside if planted == ".baton" else target)
    with (
        pytest.raises(ConfigurationError, match="symlink"),
        claim_workspace_root(root=root, explicit_worker_id="w"),
    ):
        pass
    assert sorted(path.name for path in outside.iterdir()) == ["target"]
    assert target.read_text() == "theirs\n"


def test_a_hard_link_to_a_file_elsewhere_is_never_written(tmp_path):
    (tmp_path / "root" / ".baton").mkdir(parents=True)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.write_text("theirs\n")
    os.link(elsewhere, tmp_path / "root" / ".baton" / "worker.lock")
    with (
        pytest.raises(ConfigurationError, match="not a plain file"),
        claim_workspace_root(root=tmp_path / "root", explicit_worker_id="w"),
    ):
        pass
    assert elsewhere.read_text() == "theirs\n"


def test_a_fifo_in_place_of_the_id_is_refused_without_blocking(tmp_path):
    (tmp_path / ".baton").mkdir()
    os.mkfifo(tmp_path / ".baton" / "worker-id")
    with (
        pytest.raises(ConfigurationError, match="not a plain file"),
        claim_workspace_root(root=tmp_path, explicit_worker_id=None),
    ):
        pass


@pytest.mark.parametrize("content", [b"", b"\n", b" padded \n", b"two\nlines\n", b"\xff\n"])
def test_a_kept_id_that_is_not_one_is_refused(tmp_path, content):
    (tmp_path / ".baton").mkdir()
    (tmp_path / ".baton" / "worker-id").write_bytes(content)
    with (
        pytest.raises(ConfigurationError, match="holds no valid worker id"),
        claim_workspace_root(root=tmp_path, explicit_worker_id=None),
    ):
        pass


def test_an_id_half_written_by_a_dead_worker_is_cleared(tmp_path):
    with claim_workspace_root(root=tmp_path, explicit_worker_id=None) as first:
        pass
    partial = tmp_path / ".baton" / "worker-id.0123456789abcdef.partial"
    partial.write_text("half")
    with claim_workspace_root(root=tmp_path, explicit_worker_id=None) as again:
        assert again.worker_id == first.worker_id
    assert not partial.exists()


@settings(max_examples=40, deadline=None)
@given(st.text(min_size=1, max_size=200).filter(valid_worker_id))
def test_any_valid_id_is_kept_as_given(worker_id):
    with tempfile.TemporaryDirectory() as directory:
        root = Path(directory)
        with claim_workspace_root(root=root, explicit_worker_id=worker_id):
            pass
        with claim_workspace_root(root=root, explicit_worker_id=None) as kept:
            assert (kept.worker_id, kept.source) == (worker_id, IdentitySource.KEPT)


def test_new_ids_are_valid_and_distinct():
    made = {new_worker_id() for _ in range(100)}
    assert len(made) == 100
    assert all(valid_worker_id(worker_id) for worker_id in made)


@pytest.mark.parametrize("worker_id", [" demo", "demo\n", "tab\there", ""])
def test_an_explicit_id_that_cannot_be_kept_is_a_configuration_error(worker_id):
    env = {"BATON_URL": "http://127.0.0.1:8000", "BATON_WORKER_TOKEN": "t"}
    if worker_id:
        with pytest.raises(ConfigurationError, match="worker_id"):
            load_settings(["--worker-id", worker_id], env)
    else:  # an empty variable is no explicit id: the kept one is used
        assert load_settings([], {**env, "BATON_WORKER_ID": worker_id}).worker_id is None
