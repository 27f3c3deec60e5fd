"""Baton's tables carry no index another one already covers, and the links most rows leave
empty are indexed only where set: every claim and result report changes a turn's and a task's
status, which writes an entry to each index of those tables (docs/performance-history.md,
"Fewer index writes, plans kept, the claimed rows returned")."""

from __future__ import annotations

import pytest
from django.db import connection

pytestmark = [pytest.mark.django_db, pytest.mark.postgres_only]

BATON_TABLES = ("tasks_", "dispatch_", "artifacts_", "webhooks_")

# The catalog's view of each index of a table: its name, its columns (attribute numbers) and
# operator classes, whether it is unique, and its predicate (NULL when it covers every row).
_INDEXES = """
    SELECT index_class.relname, index.indkey::text, index.indclass::text, index.indisunique,
           pg_get_expr(index.indpred, index.indrelid)
    FROM pg_index AS index
    JOIN pg_class AS index_class ON index_class.oid = index.indexrelid
    WHERE index.indrelid = %s::regclass
"""


def _tables() -> list[str]:
    with connection.cursor() as cursor:
        return [
            table
            for table in connection.introspection.table_names(cursor)
            if table.startswith(BATON_TABLES)
        ]


def _indexes(table: str) -> list[tuple[str, list[str], list[str], bool, str | None]]:
    with connection.cursor() as cursor:
        cursor.execute(_INDEXES, [table])
        return [
            (name, keys.split(), classes.split(), unique, predicate)
            for name, keys, classes, unique, predicate in cursor.fetchall()
        ]


def test_no_index_repeats_the_leading_columns_of_another():
    redundant = []
    for table in _tables():
        indexes = _indexes(table)
        for name, keys, classes, unique, predicate in indexes:
            if unique or predicate is not None:
                continue
            for other, other_keys, other_classes, _, other_predicate in indexes:
                if (
                    other != name
                    and other_predicate is None
                    and other_keys[: len(keys)] == keys
                    and other_classes[: len(classes)] == classes
                ):
                    redundant.append(f"{table}.{name} (covered by {other})")
    assert redundant == []


@pytest.mark.parametrize(
    ("table", "column"),
    [
        ("tasks_subtask", "artifact_id"),
        ("tasks_subtask", "summary_previous_id"),
        ("tasks_task", "transcript_id"),
        ("tasks_task", "turn_index_id"),
        ("tasks_task", "summary_id"),
    ],
)
def test_a_link_most_rows_leave_empty_is_indexed_only_where_set(table, column):
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT attnum FROM pg_attribute WHERE attrelid = %s::regclass AND attname = %s",
            [table, column],
        )
        (number,) = cursor.fetchone()
    leading = [index for index in _indexes(table) if index[1][0] == str(number)]
    # Still indexed: deleting an artifact or a summary finds the rows that name it.
    assert [(index[0], index[4]) for index in leading] == [
        (leading[0][0], f"({column} IS NOT NULL)")
    ]


def test_the_dispatch_tables_index_only_what_is_read():
    """The indexes a claim and a report write, by name: a new one is a decision, not a default."""
    assert {
        table: sorted(index[0] for index in _indexes(table))
        for table in (
            "tasks_subtask",
            "tasks_task",
            "dispatch_promptreport",
            "tasks_taskevent",
            "tasks_progresspiece",
        )
    } == {
        "tasks_subtask": sorted(
            [
                "tasks_subtask_pkey",
                "subtask_message_id_unique",
                "subtask_one_running_turn_per_task",
                "subtask_dispatch_order",
                "subtask_running_lease",
                "subtask_round",
                "subtask_active_per_task",
                "subtask_stop_unconfirmed",
                "subtask_artifact",
                "subtask_summary_previous",
                "tasks_subtask_claimed_by_id_30531b0f",
            ]
        ),
        "tasks_task": sorted(
            [
                "tasks_task_pkey",
                "task_owner_recent",
                "task_status_type",
                "task_transcript",
                "task_turn_index",
                "task_summary",
            ]
        ),
        "dispatch_promptreport": sorted(
            [
                "dispatch_promptreport_pkey",
                "promptreport_task_recent",
                "dispatch_promptreport_subtask_id_61d8952b",
                "dispatch_promptreport_policy_id_b8a00637",
                "dispatch_promptreport_claimed_by_id_7543e5ea",
            ]
        ),
        "tasks_taskevent": sorted(
            [
                "tasks_taskevent_pkey",
                "task_event_seq_unique",
                # Only turn.progress rows, which are deleted when their turn's attempt ends.
                "task_event_progress_turn",
            ]
        ),
        "tasks_progresspiece": sorted(["tasks_progresspiece_pkey", "progress_piece_offset_unique"]),
    }
