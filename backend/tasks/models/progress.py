"""The pieces a running turn's partial answer gained, one row per accepted append.

PostgreSQL stores a long text out of line (TOAST) and writes the whole value again on any
change, so appending to `Subtask.partial_text` would cost as much WAL as the text already
holds, and a turn's progress would cost the square of its length. A piece is written once and
never updated: an append costs what it adds. `backend.tasks.partial_texts` assembles a turn's
partial answer from its row and its pieces, and folds the pieces into the row when the
attempt ends.
"""

from __future__ import annotations

from django.db import models

from backend.tasks.models.turns import Subtask


class ProgressPiece(models.Model):
    # Indexed by `progress_piece_offset_unique`, which leads with it.
    subtask = models.ForeignKey(
        Subtask, on_delete=models.CASCADE, related_name="progress_pieces", db_index=False
    )
    # The claim's attempt that appended it: another attempt never reads it.
    attempt = models.PositiveIntegerField()
    # Code points of the partial answer before this piece.
    offset = models.PositiveIntegerField()
    text = models.TextField()

    class Meta:
        constraints = [
            # One piece per place: two appends at one offset cannot both be stored.
            models.UniqueConstraint(
                fields=["subtask", "attempt", "offset"], name="progress_piece_offset_unique"
            ),
        ]

    def __str__(self) -> str:
        return f"piece at {self.offset} of subtask {self.subtask_id} (attempt {self.attempt})"
