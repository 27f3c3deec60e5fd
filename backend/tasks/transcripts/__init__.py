"""Transcripts: the whole conversation before a turn, for the omission notice to point to.

A prompt whose history leaves messages out points, in its notice, to the task's transcript in
the executor's workspace (`.baton/history/task-<id>.md`, rendered by
`backend.prompting.transcript`), and names the same conversation split into history files
(`backend.prompting.turn_files`): each earlier turn's whole text at
`.baton/history/turns/<message_id>.md`, and their index. This package reads the turns they are
made of, and stores them when a prompt that points to them is dispatched: the transcript and the
index as the task's current ones, each turn file as the turn's artifact.

Its modules, one job each: `types` (the plain data that goes from reading to storing),
`reading` (what a dispatch or a replay reads: `transcripts_for`, `transcript_for`), `sealing`
(when a part of a long conversation is sealed, and its rows), `storing` (`store_transcripts`:
the artifacts, the parts and the task's pointers). The spans of a sealed part are
`backend.tasks.transcript_spans`, which the history window reads too.
"""

from backend.tasks.transcripts.reading import transcript_for, transcripts_for
from backend.tasks.transcripts.sealing import may_be_in_parts
from backend.tasks.transcripts.storing import store_transcripts
from backend.tasks.transcripts.types import (
    HistoryFiles,
    Stale,
    StoredPiece,
    Transcript,
    TranscriptRequest,
)

__all__ = [
    "HistoryFiles",
    "Stale",
    "StoredPiece",
    "Transcript",
    "TranscriptRequest",
    "may_be_in_parts",
    "store_transcripts",
    "transcript_for",
    "transcripts_for",
]
