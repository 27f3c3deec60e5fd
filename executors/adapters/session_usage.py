"""Each native session's last cumulative usage, kept by the worker beside the executor's state.

Codex (`turn.completed.usage`) and Claude Code (`modelUsage`, `total_cost_usd`, restored on
`--resume`) report usage as totals over a whole session, so a resumed turn's own usage is its
total minus the session's total after the previous turn. The worker keeps that previous total
in `<state_dir>/<directory>/<session id>.json`, one small file per session: no backend round
trip, and no lock, since concurrent runs on one worker share a state dir but never a session.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import tempfile
import uuid
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)


class SessionUsageStore:
    """One JSON record of usage totals per session id, under `state_dir / directory`.

    Files are replaced atomically (write a temporary file, then rename), so a run killed
    mid-write leaves the previous record, never a torn one.
    """

    def __init__(self, state_dir: Path, directory: str) -> None:
        self._dir = state_dir / directory

    def _path(self, session_id: str) -> Path | None:
        try:
            name = str(uuid.UUID(session_id))  # also keeps the id from naming another path
        except ValueError:
            return None
        return self._dir / f"{name}.json"

    def load(self, session_id: str) -> Any:
        """The usage saved for `session_id`, or None (a new session, or an unreadable file)."""
        path = self._path(session_id)
        if path is None:
            return None
        try:
            record = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None
        return record.get("usage") if isinstance(record, dict) else None

    def save(self, session_id: str, usage: dict[str, Any]) -> None:
        path = self._path(session_id)
        if path is None:
            return
        record = {"session_id": session_id, "usage": usage}
        try:
            self._dir.mkdir(parents=True, exist_ok=True)
            fd, temporary = tempfile.mkstemp(dir=self._dir, prefix=".tmp-", suffix=".json")
            try:
                with os.fdopen(fd, "w", encoding="utf-8") as file:
                    json.dump(record, file)
                    file.flush()
                    os.fsync(file.fileno())
                os.replace(temporary, path)
            except BaseException:
                with contextlib.suppress(OSError):
                    os.unlink(temporary)
                raise
        except OSError as error:
            # The session's next turn will then over-report; the run itself is fine.
            logger.warning("cannot record a session's usage: %s", error.strerror)
