"""Hand-written SQL lives in `backend/queries/` only: no other module of the backend or the
worker formats SQL text or runs it on a cursor (migrations aside: they are history)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
QUERIES = ROOT / "backend" / "queries"
# What running or formatting SQL by hand looks like in Python.
HAND_WRITTEN = re.compile(r"cursor\.execute\(|noqa: S608|\.raw\(|RawSQL\(|connection\.cursor\(")


def _modules() -> list[Path]:
    found = []
    for package in ("backend", "executors"):
        for path in (ROOT / package).rglob("*.py"):
            if "migrations" in path.parts or path.is_relative_to(QUERIES):
                continue
            found.append(path)
    return found


def test_no_module_outside_the_queries_package_runs_sql_by_hand() -> None:
    offenders = [
        f"{path.relative_to(ROOT)}:{number}: {line.strip()}"
        for path in _modules()
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if HAND_WRITTEN.search(line)
    ]
    assert offenders == []


def test_the_check_sees_what_it_looks_for() -> None:
    assert _modules()
    for line in (
        "with connection.cursor() as cursor:",
        "cursor.execute(statement, params)",
        'f"SELECT {x}"  # noqa: S608',
        "Model.objects.raw(text)",
    ):
        assert HAND_WRITTEN.search(line), line
