"""How many turns a sealed part of a transcript holds.

A long conversation's transcript is sealed in parts (`backend.tasks.transcripts`), and the
history window counts a task's earlier turns from those parts' rows (`backend.tasks.history`):
both go by these spans. They live apart from both so that neither module imports the other for
them, and both read them through this module at call time (`transcript_spans.
TRANSCRIPT_PART_TURNS`), so whoever changes a span here changes it for both.
"""

# Turns in history per long sealed part: a manifest lists three entries per sealed part.
TRANSCRIPT_PART_TURNS = 128
# Turns per short sealed part: the turns after the last long part are sealed in short parts
# until enough for a long one have finished, so a dispatch renders at most about this many
# turns again (the turns after the last sealed part) and a manifest lists at most
# TRANSCRIPT_PART_TURNS / TRANSCRIPT_SHORT_PART_TURNS - 1 short parts. Short parts are not
# used when they would not be shorter, or do not divide a long part.
TRANSCRIPT_SHORT_PART_TURNS = 16


def shorts_per_long() -> int:
    """How many short parts a long part's turns make; 0 when short parts are not used."""
    long, short = TRANSCRIPT_PART_TURNS, TRANSCRIPT_SHORT_PART_TURNS
    return long // short if short < long and long % short == 0 else 0
