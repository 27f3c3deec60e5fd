"""What this process read of the configuration tables (bots, the model table, history
policies), reused while the configuration version stays the same.

Every dispatch needs its turns' bots, their models' windows and their task types' policies:
three reads of small tables that change when an operator edits them, and otherwise never. The
claim statement returns the configuration version (`dispatch.models.ConfigurationVersion`,
which database triggers change on every write to those tables), and a read made under the
same version gives the same rows, so it is reused instead of sent again. Nothing is trusted
across versions: when the version differs, every kept read is dropped. A caller that has no
version (None) reads the database.

A version is never written twice (a sequence on PostgreSQL, 64 random bits on SQLite), so
rows read inside a transaction that later rolled back cannot pass for another's. The rows are
shared by every request of the process and must not be changed; readers return tuples.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Hashable
from typing import TypeVar

T = TypeVar("T")

# Reads kept for one version; past it, the oldest half is dropped (a version sees few keys:
# one per set of bot names, model names or task types that dispatches ask for together).
MAX_READS = 512


class ConfigurationReads:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._version: int | None = None
        self._reads: dict[Hashable, object] = {}

    def read(self, *, version: int | None, key: Hashable, load: Callable[[], T]) -> T:
        """`load()`'s answer, reused when the same key was read under `version` already."""
        if version is None:
            return load()
        with self._lock:
            if self._version == version and key in self._reads:
                return self._reads[key]  # type: ignore[return-value]
        value = load()
        with self._lock:
            if self._version != version:
                self._version, self._reads = version, {}
            if len(self._reads) >= MAX_READS:
                for old in list(self._reads)[: MAX_READS // 2]:
                    del self._reads[old]
            self._reads[key] = value
        return value

    def clear(self) -> None:
        with self._lock:
            self._version, self._reads = None, {}


CONFIGURATION = ConfigurationReads()
