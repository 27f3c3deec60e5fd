"""Turn files: every earlier turn's whole text as a file of its own, and the index listing them.

When a prompt leaves history out, the executor's workspace holds, next to the transcript, one
file per earlier turn and an index of them, so an agent with a shell can list, grep and page
through the whole conversation, whichever executor runs it and without a tool protocol (the
files stand in for Letta's ``conversation_search`` and Wegent's ``list_history`` /
``read_subtask``). The prompt names them in one line (:func:`history_files_note`), which the
omission notice shows after the transcript's pointer.

* ``.baton/history/turns/<message_id>.md`` — the turn's whole text exactly as stored: a spilled
  text whole (not its preview), a failed turn's error, nothing escaped and no header (a file an
  agent reads with its tools is not prompt structure; what the turn is, the index says). The
  bytes are the turn's artifact, so an unchanged file is never sent twice.
* ``.baton/history/turns/index.tsv`` — tab-separated UTF-8, a header line and then one line per
  turn, oldest first::

      message_id  role  name   status     chars  lines  file                       first_line
      1           USER  alice  COMPLETED  9      1      .baton/history/turns/1.md  Build it.

  ``name`` is a user turn's sender or an assistant turn's bot (``-`` when none); ``chars`` and
  ``lines`` measure the whole text (lines as Baton counts them everywhere); ``first_line`` is
  the first line of the turn's history text — a spilled text's preview, which starts as the
  text does — cut to ``FIRST_LINE_MAX_CHARS`` code points with ``…`` when longer. In ``name``
  and ``first_line``, a backslash, a tab and every other control or line-separator character is
  written as an escape (``\\\\``, ``\\t``, ``\\r``, ``\\x0b``, ``\\u2028``), so every row is
  exactly one line for grep, awk, cut and Python's ``splitlines``, whatever the turn holds.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from backend.prompting.addressing import count_lines
from backend.prompting.inputs import HistoryMessage, Role

TURNS_DIRECTORY = ".baton/history/turns"
TURN_INDEX_PATH = f"{TURNS_DIRECTORY}/index.tsv"
FIRST_LINE_MAX_CHARS = 120
INDEX_COLUMNS = ("message_id", "role", "name", "status", "chars", "lines", "file", "first_line")

# Written as an escape in an index field: the backslash itself, and every character that a
# tool could take for the end of a line or a field (C0 and C1 controls, DEL, U+2028, U+2029).
_ESCAPES: dict[int, str] = {
    **{code: f"\\x{code:02x}" for code in (*range(0x20), *range(0x7F, 0xA0))},
    ord("\\"): "\\\\",
    ord("\t"): "\\t",
    ord("\n"): "\\n",
    ord("\r"): "\\r",
    0x2028: "\\u2028",
    0x2029: "\\u2029",
}


_NEEDS_ESCAPE = re.compile("[" + re.escape("".join(map(chr, _ESCAPES))) + "]")


def turn_file_path(message_id: int) -> str:
    """Where the executor finds turn ``message_id``'s whole text in its workspace."""
    return f"{TURNS_DIRECTORY}/{message_id}.md"


def history_files_note() -> str:
    """The line that names the history files: the omission notice shows it after the
    transcript's pointer, and any other text that sends the agent to its history can too.

    It opens with ``[note``, which content can never imitate (a content line that reads like it
    is escaped), and it is the same for every task: the files live in each task's own workspace.
    """
    return (
        f"[note: each earlier turn's whole text is also in {TURNS_DIRECTORY}/<message_id>.md; "
        f"{TURN_INDEX_PATH} lists them (id, role, name, status, size, first line)]"
    )


def render_turn_index(history: Sequence[HistoryMessage], *, header: bool = True) -> str:
    """The index of ``history``'s turn files (oldest first), header line included unless
    ``header`` is false (a later part of an index rendered in parts: the parts in order are
    the index of all their turns)."""
    rows = ["\t".join(INDEX_COLUMNS)] if header else []
    for message in history:
        spilled = message.preview is not None
        lines = (
            message.artifact.total_lines
            if spilled and message.artifact is not None
            else count_lines(message.text)
        )
        name = message.sender if message.role is Role.USER else message.bot
        fields = (
            str(message.message_id),
            message.role.value,
            _field(name) if name else "-",
            "FAILED" if message.failed else "COMPLETED",
            str(message.total_chars if spilled else len(message.text)),
            str(lines),
            turn_file_path(message.message_id),
            first_line(message.text),
        )
        rows.append("\t".join(fields))
    return "\n".join(rows) + "\n"


def first_line(text: str) -> str:
    """``text``'s first line for the index: cut and escaped so it stays one field of one row."""
    end = text.find("\n")
    line = text if end == -1 else text[:end]
    if len(line) > FIRST_LINE_MAX_CHARS:
        line = line[: FIRST_LINE_MAX_CHARS - 1] + "…"
    return _field(line)


def _field(value: str) -> str:
    # Most fields hold nothing to escape, and a search is much cheaper than a translation.
    return value.translate(_ESCAPES) if _NEEDS_ESCAPE.search(value) else value
