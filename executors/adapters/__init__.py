"""One adapter per executor kind (`executors.kinds`) behind one small interface (see `base`)."""

from __future__ import annotations

from executors.adapters.base import ExecutorAdapter
from executors.kinds import KINDS


def adapter_for(kind: str) -> ExecutorAdapter:
    """A fresh adapter for `kind`, one of `executors.kinds.KINDS`."""
    if kind not in KINDS:
        raise ValueError(f"unknown executor kind {kind!r}")
    return KINDS[kind].new_adapter()
