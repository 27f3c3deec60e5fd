"""On PostgreSQL an append to a running turn's partial answer writes WAL for what it adds, not
for what the answer already holds: appending to a long text column would copy it whole
(`backend.tasks.partial_texts`)."""

from __future__ import annotations

import pytest
from django.db import connection

from tests.dispatch.test_dispatch_api import create, dispatch
from tests.dispatch.test_partial_text_appends import post

pytestmark = [
    pytest.mark.django_db,
    pytest.mark.postgres_only,
    pytest.mark.usefixtures("pipeline_bots"),
]

APPEND = "0123456789abcdef" * 8  # 128 chars, as a few deltas of a streamed answer
TRIES = 7  # other sessions write WAL too: each figure is the least of several appends


def _wal_bytes_of_appends(worker_api, turn, *, tries: int) -> int:
    least = None
    for _ in range(tries):
        offset = post(worker_api, turn).json()["partial_text_chars"]
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_current_wal_insert_lsn()")
            (before,) = cursor.fetchone()
            answer = post(worker_api, turn, partial_text_append=APPEND, partial_text_offset=offset)
            assert answer.status_code == 200
            cursor.execute("SELECT pg_wal_lsn_diff(pg_current_wal_insert_lsn(), %s)", [before])
            (written,) = cursor.fetchone()
        least = int(written) if least is None else min(least, int(written))
    assert least is not None
    return least


def test_an_append_writes_wal_for_what_it_adds_not_for_the_stored_text(api, worker_api):
    create(api)
    [turn] = dispatch(worker_api)
    # Incompressible text, as PostgreSQL would store it out of line.
    start = "".join(f"{n:08x}" for n in range(128))  # 1 KB
    assert post(worker_api, turn, partial_text=start).status_code == 200
    early = _wal_bytes_of_appends(worker_api, turn, tries=TRIES)
    long_text = "".join(f"{n:08x}" for n in range(12_800))  # 100 KB
    assert post(worker_api, turn, partial_text=long_text).status_code == 200
    late = _wal_bytes_of_appends(worker_api, turn, tries=TRIES)
    # Rewriting 100 KB would write over 100 KB of WAL on each append.
    assert late < 3 * early + 1024, (early, late)
    assert late < 10_000, (early, late)
