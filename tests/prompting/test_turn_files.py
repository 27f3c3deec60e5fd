"""Turn files and their index: exact output, one row per turn whatever it holds, and the note
that names them in the omission notice."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from backend.prompting import (
    ArtifactPointer,
    CurrentMessage,
    HistoryMessage,
    PromptInput,
    PromptParseError,
    PromptPolicy,
    Role,
    build_prompt,
    escape_content,
    make_preview,
    parse_prompt,
    turn_files,
)
from backend.prompting.turn_files import (
    FIRST_LINE_MAX_CHARS,
    history_files_note,
    render_turn_index,
    turn_file_path,
)

SPILLED = make_preview("$ make\n" + "ok\n" * 100 + "done\n", head_chars=7, tail_chars=5)
HISTORY = (
    HistoryMessage(message_id=1, role=Role.USER, text="Build it.\nThen ship.", sender="alice"),
    HistoryMessage(
        message_id=2,
        role=Role.ASSISTANT,
        text=SPILLED.text,
        bot="builder",
        preview_head=SPILLED.head,
        preview_tail=SPILLED.tail,
        total_chars=SPILLED.total_chars,
        artifact=ArtifactPointer(
            artifact_id="0123456789abcdef",
            kind="command_output",
            total_chars=SPILLED.total_chars,
            total_lines=102,
            workspace_path=".baton/artifacts/0123456789abcdef.txt",
        ),
    ),
    HistoryMessage(message_id=3, role=Role.USER, text="a\tb\\c\u2028d\re\x1bf\x85g"),
    HistoryMessage(message_id=4, role=Role.ASSISTANT, text="Timed out.", failed=True),
    HistoryMessage(message_id=6, role=Role.USER, text="x" * 500, sender="bob"),
)


def test_the_index_lists_every_turn_on_one_line() -> None:
    long_line = "x" * (FIRST_LINE_MAX_CHARS - 1) + "…"
    assert render_turn_index(HISTORY) == (
        "message_id\trole\tname\tstatus\tchars\tlines\tfile\tfirst_line\n"
        "1\tUSER\talice\tCOMPLETED\t20\t2\t.baton/history/turns/1.md\tBuild it.\n"
        "2\tASSISTANT\tbuilder\tCOMPLETED\t312\t102\t.baton/history/turns/2.md\t$ make\n"
        "3\tUSER\t-\tCOMPLETED\t13\t1\t.baton/history/turns/3.md\t"
        "a\\tb\\\\c\\u2028d\\re\\x1bf\\x85g\n"
        "4\tASSISTANT\t-\tFAILED\t10\t1\t.baton/history/turns/4.md\tTimed out.\n"
        f"6\tUSER\tbob\tCOMPLETED\t500\t1\t.baton/history/turns/6.md\t{long_line}\n"
    )


def test_whatever_a_turn_holds_its_row_is_one_line_of_eight_fields() -> None:
    awkward = "".join(map(chr, range(0x00, 0xA1))) + "\u2028\u2029 end"
    index = render_turn_index(
        (HistoryMessage(message_id=9, role=Role.USER, text=awkward, sender="zoë"),)
    )
    header, row = index.splitlines()
    assert index.count("\n") == 2 and row.count("\t") == 7
    assert row.split("\t")[:3] == ["9", "USER", "zoë"]
    assert turn_file_path(9) == row.split("\t")[6]


def test_the_notice_names_the_history_files_and_reads_back() -> None:
    transcript = ArtifactPointer(
        artifact_id="5e1f00d4c0ffee00",
        kind="transcript",
        total_chars=1_234,
        total_lines=40,
        workspace_path=".baton/history/task-7.md",
    )
    prompt_input = PromptInput(
        history=HISTORY, current=CurrentMessage(message_id=7, text="Again?"), transcript=transcript
    )
    build = build_prompt(prompt_input, PromptPolicy(max_messages=1))
    notice_lines = build.text.split("\n\n")[1].split("\n")
    assert notice_lines[1:] == [
        "[artifact 5e1f00d4c0ffee00 · transcript · 1,234 chars, 40 lines · "
        "full text: .baton/history/task-7.md]",
        history_files_note(),
    ]
    assert parse_prompt(build.text) == build.document
    # The note is structure: content cannot imitate it, and a notice without it is not Baton's.
    assert escape_content(history_files_note()) == "\\" + history_files_note()
    with pytest.raises(PromptParseError):
        parse_prompt(build.text.replace(history_files_note(), "[note: elsewhere]"))


@settings(max_examples=300)
@given(st.text())
def test_a_field_is_escaped_exactly_when_it_holds_a_character_to_escape(value):
    escaped = turn_files._field(value)
    assert escaped == value.translate(turn_files._ESCAPES)
    assert len(escaped.splitlines()) <= 1 and "\t" not in escaped
