"""Every cut a prompt makes keeps the evidence of its text's kind, within its budget.

A long log pasted as a first message, a long follow-up, a long Previous Result or a history turn
is cut by the same kind-aware cut as a spilled text's preview (``previews``): its traceback,
errors and exit codes survive, JSON still parses, code is cut on line boundaries. A larger
budget never keeps less evidence than a smaller one, and every marker counts exactly what it
stands for.
"""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from backend.prompting import (
    ArtifactPointer,
    ContextPassing,
    CurrentMessage,
    HistoryMessage,
    PromptInput,
    PromptPolicy,
    Role,
    build_prompt,
    parse_prompt,
)
from backend.prompting.evidence import evidence_lines
from backend.prompting.kinds import ArtifactKind, classify_text
from backend.prompting.previews import cut_preview, make_kind_preview, recut_preview
from backend.prompting.truncate import Preview

TRACEBACK = (
    "Traceback (most recent call last):\n"
    '  File "/srv/app/worker/pool.py", line 214, in run_batch\n'
    "    result = handler(batch)\n"
    '  File "/srv/app/worker/records.py", line 41, in parse_record\n'
    "    amount = int(fields[3])\n"
    "ValueError: invalid literal for int() with base 10: 'N/A'\n"
    "2026-11-30 12:31:07,112 ERROR worker.pool  batch 1300 failed; retrying in 5s\n"
)
EVIDENCE = [line for line in TRACEBACK.splitlines()]


def info_log(lines: int, *, start: int = 0) -> str:
    return "".join(
        f"2026-11-30 12:{n % 60:02d}:{n % 60:02d},{n % 1000:03d} INFO  worker.pool  "
        f"processed batch {n} in {n * 37 % 900} ms (queue={n % 40})\n"
        for n in range(start, start + lines)
    )


def log_with_traceback(lines: int) -> str:
    """An INFO-heavy log with a traceback right in its middle: what a user pastes."""
    return info_log(lines // 2) + TRACEBACK + info_log(lines - lines // 2, start=lines // 2)


# 300,669 characters, the size a user pasted: far over every cap, spilled at ingestion.
BIG_LOG = log_with_traceback(3_560)
MEDIUM_LOG = log_with_traceback(110)  # over the history's and the Previous Result's caps only


def pointer(text: str, kind: str) -> ArtifactPointer:
    return ArtifactPointer(
        artifact_id="a1b2c3d4e5f6",
        kind=kind,
        total_chars=len(text),
        total_lines=text.count("\n"),
        workspace_path=".baton/artifacts/a1b2c3d4e5f6.txt",
    )


def assert_keeps_the_traceback(prompt: str) -> None:
    for line in EVIDENCE:
        assert line in prompt.splitlines(), line


def test_the_sizes_are_the_ones_users_send() -> None:
    assert 295_000 < len(BIG_LOG) < 305_000
    assert 8_000 < len(MEDIUM_LOG) < 16_000
    # Neither end looks like command output: only the middle holds the evidence.
    assert classify_text(BIG_LOG) == ArtifactKind.TEXT


def test_a_long_first_message_keeps_its_traceback() -> None:
    build = build_prompt(
        PromptInput(
            current=CurrentMessage(message_id=1, text=BIG_LOG, artifact=pointer(BIG_LOG, "text"))
        ),
        PromptPolicy(),
    )
    assert_keeps_the_traceback(build.text)
    current = parse_prompt(build.text).sections[-1].messages[0]
    assert len(current.content) < 32_500  # the cap, and the markers
    assert build.report.current_truncated


def test_a_long_follow_up_keeps_its_traceback() -> None:
    history = (
        HistoryMessage(message_id=1, role=Role.USER, text="The nightly import fails."),
        HistoryMessage(message_id=2, role=Role.ASSISTANT, text="Send me the worker's log."),
    )
    build = build_prompt(
        PromptInput(
            history=history,
            current=CurrentMessage(message_id=3, text=BIG_LOG, artifact=pointer(BIG_LOG, "text")),
        ),
        PromptPolicy(),
    )
    assert "## Current Message" in build.text
    assert_keeps_the_traceback(build.text)


def test_a_long_previous_result_keeps_its_traceback() -> None:
    build = build_prompt(
        PromptInput(
            current=CurrentMessage(message_id=1, text="Fix what the run below shows."),
            previous_result=MEDIUM_LOG,
            previous_result_message_id=2,
            previous_result_bot="runner",
        ),
        PromptPolicy(),
        context_passing=ContextPassing.ORIGINAL_AND_PREVIOUS,
    )
    assert "## Previous Result" in build.text
    assert_keeps_the_traceback(build.text)


def test_a_long_history_turn_keeps_its_traceback() -> None:
    history = (
        HistoryMessage(message_id=1, role=Role.USER, text=MEDIUM_LOG),
        HistoryMessage(message_id=2, role=Role.ASSISTANT, text="Looking at it."),
    )
    build = build_prompt(
        PromptInput(history=history, current=CurrentMessage(message_id=3, text="And now?")),
        PromptPolicy(),
    )
    assert build.report.truncated  # cut at the per-message cap
    assert_keeps_the_traceback(build.text)


def test_a_stored_preview_cut_again_keeps_its_traceback() -> None:
    stored = make_kind_preview(BIG_LOG, "text", head_chars=2_000, tail_chars=2_000)
    assert_keeps_the_traceback(stored.text)
    again = recut_preview(stored, 1_500, "text")
    assert again.kept_chars <= 1_500
    assert again.total_chars == len(BIG_LOG)
    for line in EVIDENCE[-2:]:  # the exception and the error line, at least
        assert line in again.text.splitlines()


def test_a_cut_of_json_still_parses_and_of_code_ends_on_lines() -> None:
    document = json.dumps({"rows": [{"id": n, "name": f"row {n}"} for n in range(2_000)]})
    cut = cut_preview(document, 4_000)
    assert cut is not None and cut.kept_chars <= 4_000
    json.loads(cut.text)
    code = "".join(f"def handler_{n}(event):\n    return event + {n}\n\n" for n in range(400))
    cut = cut_preview(code, 4_000)
    assert cut is not None
    head, _, tail = cut.text.partition("…")
    assert head.endswith("\n")
    assert cut.text.split("truncated…", 1)[1].startswith("\n")


# --- invariants -----------------------------------------------------------------------------

FILLER = st.sampled_from(
    [
        "INFO worker processed a batch",
        "DEBUG cache hit for key 42",
        "tests/test_io.py .... ok",
        "A snippet that says something useful about the topic.",
        "    indented continuation of the record",
        "",
    ]
)
EVIDENCE_LINES = st.sampled_from(
    [
        TRACEBACK.rstrip("\n"),
        "ERROR worker.pool batch failed; retrying",
        "ValueError: invalid literal",
        "FAILED tests/test_math.py::test_add",
        "exit code 2",
        "$ make test",
        "error: could not compile `baton`",
        "the import failed twice",
        "https://example.com/results/7",
        "## Result 3",
        "Title: How to read a traceback",
    ]
)
logs = st.lists(st.one_of(FILLER, FILLER, FILLER, EVIDENCE_LINES), min_size=20, max_size=400).map(
    lambda lines: "\n".join(lines) + "\n"
)
KINDS = st.sampled_from(
    [
        ArtifactKind.COMMAND_OUTPUT,
        ArtifactKind.TEXT,
        ArtifactKind.WEB_OR_SEARCH,
        ArtifactKind.FILE_OR_CODE,
    ]
)


def visible_evidence(text: str, kind: str, cut: Preview) -> set[tuple[int, int]]:
    """The evidence lines of the whole ``text`` whose every character the cut shows."""
    slices = cut.slices()
    visible = set()
    for line in evidence_lines(text, 0, len(text), kind):
        start = line.start + (text[line.start] == "\n")
        end = line.end - (line.end > start and text[line.end - 1] == "\n")
        if any(offset <= start and end <= offset + len(part) for offset, part in slices):
            visible.add((start, end))
    return visible


def assert_verbatim(text: str, cut: Preview) -> None:
    for offset, part in cut.slices():
        assert text[offset : offset + len(part)] == part
    assert cut.kept_chars + cut.removed_chars == len(text)
    assert cut.total_chars == len(text)


@settings(max_examples=150, deadline=None)
@given(logs, KINDS, st.integers(0, 3_000), st.integers(1, 3_000))
def test_a_larger_budget_never_keeps_less_evidence(
    text: str, kind: str, budget: int, more: int
) -> None:
    small = cut_preview(text, budget, kind) or Preview(head=text, tail="", total_chars=len(text))
    large = cut_preview(text, budget + more, kind) or Preview(
        head=text, tail="", total_chars=len(text)
    )
    for cut, cap in ((small, budget), (large, budget + more)):
        assert cut.kept_chars <= cap
        assert_verbatim(text, cut)
    assert visible_evidence(text, kind, small) <= visible_evidence(text, kind, large)


@settings(max_examples=100, deadline=None)
@given(logs, KINDS, st.integers(40, 1_200), st.integers(0, 2_000), st.integers(1, 2_000))
def test_a_stored_preview_cut_again_keeps_more_evidence_with_more_room(
    text: str, kind: str, stored: int, budget: int, more: int
) -> None:
    preview = make_kind_preview(text, kind, head_chars=stored // 2, tail_chars=stored - stored // 2)
    small = recut_preview(preview, budget, kind)
    large = recut_preview(preview, budget + more, kind)
    for cut, cap in ((small, budget), (large, budget + more)):
        assert cut.kept_chars <= max(cap, 0) or cut is preview
        assert_verbatim(text, cut)
    if kind != ArtifactKind.JSON:
        assert visible_evidence(text, kind, small) <= visible_evidence(text, kind, large)


@pytest.mark.parametrize("cap", [0, 1, 7, 100, 4_000])
def test_the_markers_count_what_they_stand_for(cap: int) -> None:
    cut = cut_preview(MEDIUM_LOG, cap, "text")
    assert cut is not None
    assert_verbatim(MEDIUM_LOG, cut)
    counted = sum(int(n) for n in __import__("re").findall(r"…(\d+) chars truncated…", cut.text))
    assert counted == cut.removed_chars
