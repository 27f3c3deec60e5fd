"""Each native session's last cumulative usage, kept by the worker beside the executor's state.

Codex (`turn.completed.usage`) and Claude Code (`modelUsage`, `total_cost_usd`, restored on
`--resume`) report usage as totals over a whole session, so a resumed turn's own usage is its
total minus the session's total after the previous turn. The worker keeps that previous total
in `<state_dir>/<directory>/<session id>.json`, one small file per session: no backend round
trip, and no lock, since concurrent runs on one worker share a state dir but never a session.

The state dir is also the executor's home (CODEX_HOME), which its tool commands can write: the
records are reached link-safely (`executors.workspace`), so a link planted there is neither
followed nor written through.
"""

from __future__ import annotations

import json
import logging
import os
import uuid
from pathlib import Path
from typing import Any

from executors.workspace import open_directory, open_held_file, replacing

logger = logging.getLogger(__name__)


class SessionUsageStore:
    """One JSON record of usage totals per session id, under `state_dir / directory`.

    Files are replaced atomically (write a temporary file, then rename), so a run killed
    mid-write leaves the previous record, never a torn one.
    """

    def __init__(self, state_dir: Path, directory: str) -> None:
        # Anchored at the state dir's parent (the worker's state root): the executor can
        # replace its own state dir, not the root above it.
        self._anchor = state_dir.parent
        self._relative = f"{state_dir.name}/{directory}"

    @staticmethod
    def _name(session_id: str) -> str | None:
        try:
            name = str(uuid.UUID(session_id))  # also keeps the id from naming another path
        except ValueError:
            return None
        return f"{name}.json"

    def load(self, session_id: str) -> Any:
        """The usage saved for `session_id`, or None (a new session, or an unreadable file)."""
        name = self._name(session_id)
        if name is None:
            return None
        try:
            directory = open_directory(self._anchor, self._relative, create=False)
        except OSError:
            return None
        try:
            fd = open_held_file(directory, name)
        finally:
            os.close(directory)
        if fd is None:
            return None
        try:
            with os.fdopen(fd, "rb") as file:
                record = json.loads(file.read())
        except (OSError, ValueError):
            return None
        return record.get("usage") if isinstance(record, dict) else None

    def save(self, session_id: str, usage: dict[str, Any]) -> None:
        name = self._name(session_id)
        if name is None:
            return
        record = {"session_id": session_id, "usage": usage}
        try:
            directory = open_directory(self._anchor, self._relative, create=True)
            try:
                with replacing(directory, name) as file:
                    file.write(json.dumps(record).encode())
                    file.flush()
                    os.fsync(file.fileno())
            finally:
                os.close(directory)
        except OSError as error:
            # The session's next turn will then over-report; the run itself is fine.
            logger.warning("cannot record a session's usage: %s", error.strerror)
