"""Kind-aware previews: exact output per kind, and what every preview keeps true."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from backend.prompting import (
    ArtifactPointer,
    CurrentMessage,
    HistoryMessage,
    PromptInput,
    PromptPolicy,
    Role,
    build_prompt,
    parse_prompt,
    previews,
)
from backend.prompting.kinds import ArtifactKind, classify_ends, classify_text
from backend.prompting.previews import (
    TextEnds,
    ends_to_read,
    make_ends_preview,
    make_kind_preview,
    skeleton_walk,
)
from backend.prompting.truncate import Elision, ElisionStyle, Preview
from tests.prompting.strategies import adversarial_text, json_text, long_text


def m(removed: int) -> str:
    return f"…{removed} chars truncated…"


API_RESPONSE = json.dumps(
    {
        "items": [{"id": n, "name": f"item {n}", "tags": ["a", "b"]} for n in range(40)],
        "count": 40,
        "next": "https://api.example.com/items?page=2",
    },
    indent=1,
)
WIDE = json.dumps({"title": "x" * 500, "numbers": list(range(300)), "ok": True})
TEST_RUN = (
    "$ pytest -q\n"
    + "".join(f"tests/test_{n}.py .... ok\n" for n in range(30))
    + "E   AssertionError: expected 3, got 4\n"
    + "".join(f"collected line {n}\n" for n in range(30))
    + "FAILED tests/test_math.py::test_add\n"
    + "".join(f"teardown {n}\n" for n in range(30))
    + "1 failed, 29 passed in 0.52s\n"
    + "exit code 1\n"
)
SEARCH = "".join(
    f"## Result {n}\nA snippet that says something about topic {n}.\nhttps://example.com/{n}\n\n"
    for n in range(30)
)
CODE = "".join(f"def handler_{n}(event):\n    return event + {n}\n\n" for n in range(60))
PROSE = "word " * 400


@pytest.mark.parametrize(
    ("text", "kind", "head", "tail", "expected"),
    [
        pytest.param(
            API_RESPONSE,
            ArtifactKind.JSON,
            150,
            150,
            '{\n "items": [\n  {\n   "id": 0,\n   "name": "item 0",\n   "tags": [\n    "a",\n'
            '    "b"\n   ]\n  },\n  {\n   "id": 1,\n   "name": "item 1",\n   "tags": [\n'
            '    "a",\n    "b"\n   ]\n  },\n  "' + m(2982) + '"\n ],\n "count": 40,\n'
            ' "next": "https://api.example.com/items?page=2"\n}',
            id="json-keeps-its-first-elements-and-every-key",
        ),
        pytest.param(
            WIDE,
            ArtifactKind.JSON,
            100,
            100,
            '{"title": "'
            + "x" * 22
            + m(456)
            + "x" * 22
            + '", "numbers": ['
            + ", ".join(map(str, range(31)))
            + ', "'
            + m(1274)
            + '"], "ok": true}',
            id="json-cuts-long-strings-inside-and-arrays-after-their-first-elements",
        ),
        pytest.param(
            TEST_RUN,
            ArtifactKind.COMMAND_OUTPUT,
            100,
            100,
            "$ pytest -q\ntests/test_0.py .... ok\n"
            + m(715)
            + "\nE   AssertionError: expected 3, got 4\n"
            + m(529)
            + "\nFAILED tests/test_math.py::test_add\n"
            + m(313)
            + "\nteardown 27\nteardown 28\nteardown 29\n"
            "1 failed, 29 passed in 0.52s\nexit code 1\n",
            id="command-output-keeps-command-errors-summary-and-exit-code",
        ),
        pytest.param(
            SEARCH,
            ArtifactKind.WEB_OR_SEARCH,
            100,
            100,
            "## Result 0\n"
            + m(44)
            + "\nhttps://example.com/0\n\n## Result 1\n"
            + m(44)
            + "\nhttps://example.com/1\n\n## Result 2\n"
            + m(44)
            + "\nhttps://example.com/2\n"
            + m(2150)
            + "\nA snippet that says something about topic 29.\nhttps://example.com/29\n\n",
            id="search-results-keep-titles-and-urls",
        ),
        pytest.param(
            CODE,
            ArtifactKind.FILE_OR_CODE,
            100,
            100,
            "def handler_0(event):\n    return event + 0\n\ndef handler_1(event):\n"
            "    return event + 1\n\n"
            + m(2558)
            + "\n\ndef handler_58(event):\n    return event + 58\n\n"
            "def handler_59(event):\n    return event + 59\n\n",
            id="code-is-cut-on-line-boundaries",
        ),
        pytest.param(
            PROSE,
            ArtifactKind.TEXT,
            20,
            20,
            "word word word word " + m(1960) + "word word word word ",
            id="text-without-line-breaks-is-cut-like-before",
        ),
    ],
)
def test_each_kind_keeps_its_evidence(
    text: str, kind: ArtifactKind, head: int, tail: int, expected: str
) -> None:
    assert classify_text(text) == kind
    preview = make_kind_preview(text, kind, head_chars=head, tail_chars=tail)
    assert preview.text == expected
    assert preview.kept_chars <= head + tail
    if kind is ArtifactKind.JSON:
        json.loads(preview.text)


def test_a_json_member_that_does_not_fit_becomes_one_marker_member() -> None:
    text = json.dumps({f"key_{n}": n for n in range(200)})
    preview = make_kind_preview(text, ArtifactKind.JSON, head_chars=30, tail_chars=30)
    assert preview.text == (
        '{"key_0": 0, "key_1": 1, "key_2": 2, "key_3": 3, "' + m(2930) + '": null}'
    )
    assert preview.elisions == (Elision(2930, ElisionStyle.JSON_MEMBERS),)
    json.loads(preview.text)


def test_escapes_in_json_strings_are_never_split() -> None:
    text = json.dumps({"path": "C:\\dir\\" * 200 + "\u00e9\n" * 50}, ensure_ascii=True)
    for budget in range(40, 120):
        preview = make_kind_preview(text, ArtifactKind.JSON, head_chars=budget, tail_chars=0)
        json.loads(preview.text)


def test_text_that_is_not_json_gets_the_line_preview() -> None:
    text = "{ not json\n" + "line\n" * 400 + "}"
    preview = make_kind_preview(text, ArtifactKind.JSON, head_chars=30, tail_chars=30)
    assert preview.text == "{ not json\nline\nline\nline\n" + m(1959) + "\nline" * 5 + "\n}"


def _slices_are_verbatim(text: str, preview: Preview) -> None:
    for offset, part in preview.slices():
        assert text[offset : offset + len(part)] == part


@given(
    text=st.one_of(json_text, long_text, adversarial_text),
    kind=st.sampled_from(list(ArtifactKind)),
    head=st.integers(0, 300),
    tail=st.integers(0, 300),
)
def test_every_preview_keeps_verbatim_parts_within_its_budget(
    text: str, kind: ArtifactKind, head: int, tail: int
) -> None:
    """Whatever the kind: the kept parts are the original's own, in order, within the budget;
    the markers' counts add up to exactly what was left out; valid JSON stays valid JSON."""
    preview = make_kind_preview(text, kind, head_chars=head, tail_chars=tail)
    assert preview.total_chars == len(text)
    if len(text) <= head + tail:
        assert preview.text == text
        return
    assert preview.kept_chars <= head + tail
    _slices_are_verbatim(text, preview)


@given(text=json_text, budget=st.integers(0, 400))
def test_json_skeletons_are_valid_json(text: str, budget: int) -> None:
    """The walk itself keeps JSON valid (the parse check behind it is only a safety net)."""
    preview = skeleton_walk(text, budget)
    if preview is not None:
        assert preview.kept_chars <= budget
        json.loads(preview.text)
        _slices_are_verbatim(text, preview)


@given(
    text=st.one_of(json_text, long_text),
    kind=st.sampled_from(list(ArtifactKind)),
    limit=st.integers(0, 300),
)
def test_a_recut_preview_still_counts_against_the_whole_text(
    text: str, kind: ArtifactKind, limit: int
) -> None:
    preview = make_kind_preview(text, kind, head_chars=200, tail_chars=200)
    recut = preview.recut(limit)
    assert recut.kept_chars <= max(limit, 0) or recut is preview
    assert recut.total_chars == len(text)
    _slices_are_verbatim(text, recut)


def test_a_kind_aware_preview_in_history_round_trips_through_the_prompt() -> None:
    """Every marker of a several-part preview stays a marker; typed ones are escaped."""
    text = TEST_RUN.replace("exit code 1", "exit code 1 …3 chars truncated…")
    preview = make_kind_preview(text, ArtifactKind.COMMAND_OUTPUT, head_chars=100, tail_chars=100)
    pointer = ArtifactPointer(
        artifact_id="a1",
        kind="command_output",
        total_chars=len(text),
        total_lines=text.count("\n"),
        workspace_path=".baton/artifacts/a1.txt",
    )
    message = HistoryMessage(
        message_id=2,
        role=Role.ASSISTANT,
        text=preview.text,
        total_chars=preview.total_chars,
        preview_head=preview.head,
        preview_tail=preview.tail,
        preview_middle=preview.middle,
        preview_elisions=preview.elisions,
        artifact=pointer,
    )
    build = build_prompt(
        PromptInput(
            history=(
                HistoryMessage(message_id=1, role=Role.USER, text="run the tests"),
                message,
            ),
            current=CurrentMessage(message_id=3, text="fix it"),
        ),
        PromptPolicy(per_message_max_chars=None),
    )
    assert "…\\3 chars truncated…" in build.text
    for elision in preview.elisions:  # each real marker stands on a line of its own
        assert f"\n{m(elision.removed)}\n" in build.text
    [history, _current] = parse_prompt(build.text).sections
    assert history.messages[1].content == preview.text
    assert len(history.messages[1].markers) == len(preview.elisions)


def test_a_preview_must_account_for_every_removed_code_point() -> None:
    with pytest.raises(ValueError, match="exactly what the kept parts leave out"):
        Preview(
            head="a", tail="b", total_chars=10, middle=("c",), elisions=(Elision(3), Elision(3))
        )
    with pytest.raises(ValueError, match="one elision between each two kept parts"):
        Preview(head="a", tail="b", total_chars=10, middle=("c",), elisions=(Elision(7),))


def test_evidence_is_a_word_start_in_any_common_case() -> None:
    """``ERROR`` and ``Traceback`` are evidence wherever they are; ``terror`` is not."""
    filler = "".join(f"building step {n}\n" for n in range(40))
    text = "$ make\n" + filler + "no terror here\n" + filler + "ERROR: disk full\n" + filler
    text += "Traceback (most recent call last):\n" + filler + "exit status 2\n"
    preview = make_kind_preview(text, ArtifactKind.COMMAND_OUTPUT, head_chars=60, tail_chars=60)
    assert preview.middle == ("\nERROR: disk full\n", "\nTraceback (most recent call last):\n")
    assert "terror" not in preview.text


# --- texts too long to scan: previews from their two ends ----------------------------------

# A line no evidence pattern matches, of any kind.
FILLER_LINE = "plain filler line\n"


@pytest.mark.parametrize(
    ("length", "head", "tail", "each"),
    [
        (8_000_000, 2_000, 2_000, None),
        (8_000_001, 2_000, 2_000, 4_000_000),
        (50_000_000, 2_000, 2_000, 4_000_000),
        (50_000_000, 5_000_000, 0, 5_000_001),
        (48_000_002, 20_000_000, 4_000_000, None),
        (48_000_003, 20_000_000, 4_000_000, 24_000_001),
    ],
)
def test_a_text_is_read_at_its_ends_past_the_scan_bound(length, head, tail, each) -> None:
    assert ends_to_read(length, head_chars=head, tail_chars=tail) == each


@given(
    head=st.one_of(long_text, adversarial_text),
    tail=st.one_of(long_text, adversarial_text),
    kind=st.sampled_from(list(ArtifactKind)),
    head_chars=st.integers(0, 300),
    tail_chars=st.integers(0, 300),
)
def test_a_preview_from_the_ends_is_the_whole_texts_when_only_the_ends_hold_evidence(
    head: str, tail: str, kind: ArtifactKind, head_chars: int, tail_chars: int
) -> None:
    """Head and tail cuts depend on the ends alone, and with no evidence in the middle the
    evidence lines are the same: reading the ends gives the preview reading all of it gives."""
    each = max(len(head), len(tail), head_chars + tail_chars) + 2 * len(FILLER_LINE)
    filler = FILLER_LINE * (2 * each // len(FILLER_LINE) + 1)
    text = head + "\n" + filler + tail
    ends = TextEnds.of(text, each)
    from_ends = make_ends_preview(ends, kind, head_chars=head_chars, tail_chars=tail_chars)
    assert from_ends == make_kind_preview(text, kind, head_chars=head_chars, tail_chars=tail_chars)


@given(
    text=st.one_of(long_text, adversarial_text),
    kind=st.sampled_from(list(ArtifactKind)),
    head=st.integers(0, 100),
    tail=st.integers(0, 100),
    each=st.integers(201, 400),
)
def test_every_preview_from_the_ends_keeps_verbatim_parts_within_its_budget(
    text: str, kind: ArtifactKind, head: int, tail: int, each: int
) -> None:
    text = (text * (2 * each // max(len(text), 1) + 2)) or "x" * (2 * each + 1)
    preview = make_ends_preview(TextEnds.of(text, each), kind, head_chars=head, tail_chars=tail)
    assert preview.total_chars == len(text)
    assert preview.kept_chars <= head + tail
    _slices_are_verbatim(text, preview)
    kept_middle = [
        (offset, part)
        for offset, part in preview.slices()
        if offset < len(text) - each and offset + len(part) > each
    ]
    assert kept_middle == []  # nothing between the ends, which were never read


def test_evidence_past_the_scan_bound_is_looked_for_at_the_ends_only(monkeypatch) -> None:
    monkeypatch.setattr(previews, "PREVIEW_SCAN_MAX_CHARS", 2_000)
    filler = FILLER_LINE * 200
    log = "$ make\n" + filler + "error: in the middle\n" + filler + "FAILED at the end\nok\n"
    preview = make_kind_preview(log, ArtifactKind.COMMAND_OUTPUT, head_chars=60, tail_chars=60)
    assert "FAILED at the end" in preview.text
    assert "in the middle" not in preview.text
    ends = TextEnds.of(log, 1_000)
    assert preview == make_ends_preview(
        ends, ArtifactKind.COMMAND_OUTPUT, head_chars=60, tail_chars=60
    )


def test_a_json_text_past_the_scan_bound_gets_the_line_preview(monkeypatch) -> None:
    monkeypatch.setattr(previews, "PREVIEW_SCAN_MAX_CHARS", 2_000)
    text = json.dumps({"rows": [f"row {n}" for n in range(400)]}, indent=1)
    preview = make_kind_preview(text, ArtifactKind.JSON, head_chars=30, tail_chars=30)
    assert preview == make_kind_preview(text, ArtifactKind.TEXT, head_chars=30, tail_chars=30)
    assert skeleton_walk(text, 60) is not None  # a whole read would have made a skeleton


@pytest.mark.parametrize("text", [TEST_RUN * 300, SEARCH * 200, CODE * 200, API_RESPONSE * 30])
def test_the_ends_classify_a_long_text_as_the_whole_text_does(text: str) -> None:
    assert classify_ends(text[:9_000], text[-8_500:]) == classify_text(text)
