"""Executor homes made afresh before each run: only the task's session files stay, no link is
followed, and each task and executor kind has a home of its own (`executors/homes.py`)."""

from __future__ import annotations

import shutil
import threading
from pathlib import Path

from executors.adapters.claude_code import ClaudeCodeAdapter
from executors.adapters.codex import CodexAdapter
from executors.homes import HomeTemplate, TaskHome, home_name

SESSION = "66de2293-10b7-408c-b747-7769c8458ff2"


def _write(path: Path, text: str = "x") -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def test_a_codex_home_keeps_its_sessions_and_loses_everything_planted(tmp_path: Path) -> None:
    template = HomeTemplate(session_files=CodexAdapter.session_files)
    home = TaskHome(state_root=tmp_path, task_id=7, name="codex", template=template).make_afresh()
    assert home == tmp_path / "homes" / "7" / "codex"
    kept = [
        "sessions/2026/12/07/rollout-1.jsonl",
        "archived_sessions/rollout-0.jsonl",
        f"baton-thread-usage/{SESSION}.json",
    ]
    planted = [
        "config.toml",
        "AGENTS.override.md",
        "AGENTS.md",
        "skills/x/SKILL.md",
        "rules/x.rules",
        "state_5.sqlite",
        "memories_1.sqlite",
        "shell_snapshots/snapshot.sh",
        "home/.profile",
        "home/.bashrc",
        "home/.codex/config.toml",
    ]
    for name in kept + planted:
        _write(home / name)
    assert (
        TaskHome(state_root=tmp_path, task_id=7, name="codex", template=template).make_afresh()
        == home
    )
    for name in kept:
        assert (home / name).is_file(), name
    for name in planted:
        assert not (home / name).exists(), name
    assert (home / "home").is_dir() and not any((home / "home").iterdir())


def test_a_claude_code_home_keeps_session_transcripts_only(tmp_path: Path) -> None:
    template = HomeTemplate(session_files=ClaudeCodeAdapter.session_files)
    home = TaskHome(
        state_root=tmp_path, task_id=7, name="claude_code", template=template
    ).make_afresh()
    project = home / "projects" / "-srv-baton-7"
    kept = [project / f"{SESSION}.jsonl", project / SESSION / "tool-results" / "a.txt"]
    planted = [
        home / "settings.json",
        home / "CLAUDE.md",
        home / ".claude.json",
        home / "agents" / "x.md",
        home / "hooks" / "x.sh",
        home / "skills" / "x" / "SKILL.md",
        project / "memory" / "MEMORY.md",
        project / "CLAUDE.md",
        home / "home" / ".claude" / "settings.json",
    ]
    for path in kept + planted:
        _write(path)
    TaskHome(state_root=tmp_path, task_id=7, name="claude_code", template=template).make_afresh()
    for path in kept:
        assert path.is_file(), path
    for path in planted:
        assert not path.exists(), path


def test_links_are_removed_never_followed(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    _write(outside / "precious.txt")
    template = HomeTemplate(session_files=CodexAdapter.session_files)
    state_root = tmp_path / "state"
    home = TaskHome(state_root=state_root, task_id=7, name="codex", template=template).make_afresh()
    # A session file, a session directory and the home itself, each a link elsewhere.
    (home / "baton-thread-usage").mkdir()
    (home / "baton-thread-usage" / f"{SESSION}.json").symlink_to(outside / "precious.txt")
    (home / "sessions").symlink_to(outside)
    (home / "home").rmdir()
    (home / "home").symlink_to(outside)
    TaskHome(state_root=state_root, task_id=7, name="codex", template=template).make_afresh()
    assert not (home / "baton-thread-usage" / f"{SESSION}.json").is_symlink()
    assert not (home / "sessions").exists()
    assert (home / "home").is_dir() and not (home / "home").is_symlink()
    assert (outside / "precious.txt").is_file()
    # A task's directory replaced by a link to another's is replaced, not followed.
    other = TaskHome(
        state_root=state_root, task_id=8, name="codex", template=template
    ).make_afresh()
    _write(other / "sessions" / "theirs.jsonl")
    task_dir = state_root / "homes" / "7"
    shutil.rmtree(task_dir)
    task_dir.symlink_to(state_root / "homes" / "8")
    home = TaskHome(state_root=state_root, task_id=7, name="codex", template=template).make_afresh()
    assert not task_dir.is_symlink()
    assert not (home / "sessions").exists()
    assert (other / "sessions" / "theirs.jsonl").is_file()


def test_each_task_and_job_has_a_home_of_its_own(tmp_path: Path) -> None:
    template = HomeTemplate(session_files=CodexAdapter.session_files)
    homes = {
        TaskHome(
            state_root=tmp_path, task_id=task, name=home_name(kind=kind, job=job), template=template
        ).make_afresh()
        for task in (1, 2)
        for kind in ("codex", "claude_code")
        for job in ("turn", "summary")
    }
    assert len(homes) == 8


def test_runs_of_one_home_take_turns_and_other_homes_do_not_wait(tmp_path: Path) -> None:
    template = HomeTemplate()
    home = TaskHome(state_root=tmp_path, task_id=1, name="codex", template=template)
    same = TaskHome(state_root=tmp_path, task_id=1, name="codex", template=template)
    other = TaskHome(state_root=tmp_path, task_id=2, name="codex", template=template)
    entered = threading.Event()

    def second_run() -> None:
        with same.held():
            entered.set()

    with home.held():
        with other.held():
            pass  # another task's home is not held up
        thread = threading.Thread(target=second_run)
        thread.start()
        assert not entered.wait(0.2)  # the same home waits for the run that holds it
    assert entered.wait(5)
    thread.join(5)
