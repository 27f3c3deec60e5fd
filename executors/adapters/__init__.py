"""One adapter per executor kind behind one small interface (see `base`)."""

from __future__ import annotations

from executors.adapters.base import ExecutorAdapter


def adapter_for(kind: str) -> ExecutorAdapter:
    """A fresh adapter for `kind` ("codex", "claude_code" or "agno")."""
    # Imported on demand: a worker serving one kind never loads the others' modules.
    if kind == "codex":
        from executors.adapters.codex import CodexAdapter

        return CodexAdapter()
    if kind == "claude_code":
        from executors.adapters.claude_code import ClaudeCodeAdapter

        return ClaudeCodeAdapter()
    if kind == "agno":
        from executors.adapters.agno import AgnoAdapter

        return AgnoAdapter()
    raise ValueError(f"unknown executor kind {kind!r}")
