"""The history window: what prompt building reads from the database for one ASSISTANT turn.

It turns rows into the pure core's inputs (`backend.prompting.PromptInput`) with a constant
number of queries, reading only the bounded fields ingestion stored (history text or preview,
token counts, artifact pointer) and never a turn's full `message` or `result`, except the
current user message itself, which is bounded by the message size limit. So a build costs the
same whether the task's results were 1 KB or 1 GB each.

Which rows: the task's COMPLETED and FAILED turns older than the user message being answered,
newest first up to the policy's `max_messages`, plus the task's first user message when the
policy pins it. Older turns are only counted (by role) so the omission notice stays exact.
Summary jobs are not turns and never part of a history; with summaries on, the task's latest
finished summary comes with the anchors (no query of its own), and a summary job's own input is
read by `summary_job_inputs_for` (two queries for a batch).

Its modules, each a job: `rows` (what a history row is and how it becomes an input),
`selection` (which rows a batch reads), `inputs` (a turn's input from its rows), `snapshots`
(a build's input kept and read again for a replay) and `summaries` (a summary job's input).
"""

from backend.tasks.history.inputs import prompt_input_for, prompt_inputs_for
from backend.tasks.history.rows import (
    CACHED_TOKEN_COUNTS,
    FIRST_USER_MESSAGE_ID,
    HISTORY_FIELDS,
    HISTORY_STATUSES,
    SUMMARY_FIELDS,
    HistoryUnavailable,
    cached_counts_encoding,
    history_message,
    history_summary,
)
from backend.tasks.history.selection import any_of
from backend.tasks.history.snapshots import input_snapshot, prompt_input_from_snapshot
from backend.tasks.history.summaries import summary_job_inputs_for

__all__ = [
    "CACHED_TOKEN_COUNTS",
    "FIRST_USER_MESSAGE_ID",
    "HISTORY_FIELDS",
    "HISTORY_STATUSES",
    "SUMMARY_FIELDS",
    "HistoryUnavailable",
    "any_of",
    "cached_counts_encoding",
    "history_message",
    "history_summary",
    "input_snapshot",
    "prompt_input_for",
    "prompt_input_from_snapshot",
    "prompt_inputs_for",
    "summary_job_inputs_for",
]
