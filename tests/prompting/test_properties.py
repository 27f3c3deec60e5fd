"""Invariants of every build, for arbitrary inputs (content imitating structure included)."""

from __future__ import annotations

import re
import unicodedata

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from backend.prompting import (
    HistoryMessage,
    PromptBudgetError,
    PromptBuild,
    PromptInput,
    PromptPolicy,
    Role,
    Section,
    build_prompt,
    count_tokens,
    escaping,
    parse_prompt,
    render_document,
)
from backend.prompting.addressing import content_pointer
from backend.prompting.escaping import escape_content
from backend.prompting.previews import recut_preview
from backend.prompting.render import message_piece
from tests.prompting.strategies import policies, prompt_inputs, token_policies

BUILD_SETTINGS = settings(
    max_examples=120,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


def _included(prompt_input: PromptInput, build: PromptBuild) -> list[HistoryMessage]:
    by_id = {message.message_id: message for message in prompt_input.history}
    return [by_id[message_id] for message_id in build.report.included_message_ids]


def _is_exact_cut(content: str, removed: int, kept: int, head_of: str, tail_of: str) -> bool:
    """``content`` is X + marker + Y, with X from ``head_of`` and Y from ``tail_of``."""
    marker = f"…{removed} chars truncated…"
    start = content.find(marker)
    while start != -1:
        head, tail = content[:start], content[start + len(marker) :]
        if len(head) + len(tail) == kept and head_of.startswith(head) and tail_of.endswith(tail):
            return True
        start = content.find(marker, start + 1)
    return False


@BUILD_SETTINGS
@given(prompt_input=prompt_inputs(), policy=policies())
def test_parse_recovers_exactly_what_was_rendered(
    prompt_input: PromptInput, policy: PromptPolicy
) -> None:
    build = build_prompt(prompt_input, policy)
    assert render_document(build.document) == build.text
    assert parse_prompt(build.text) == build.document


@BUILD_SETTINGS
@given(prompt_input=prompt_inputs(), policy=policies() | token_policies())
def test_token_count_is_exact_and_within_budget(
    prompt_input: PromptInput, policy: PromptPolicy
) -> None:
    build = build_prompt(prompt_input, policy)
    report = build.report
    assert report.tokens == count_tokens(build.text)
    assert report.tokens == (
        report.history_tokens
        + report.current_tokens
        + report.previous_result_tokens
        + report.note_tokens
    )
    if policy.max_tokens is not None:
        assert report.tokens <= policy.max_tokens
    assert report.chars == len(build.text)


@BUILD_SETTINGS
@given(prompt_input=prompt_inputs(), policy=policies())
def test_output_is_within_every_cap_and_markers_are_exact(
    prompt_input: PromptInput, policy: PromptPolicy
) -> None:
    build = build_prompt(prompt_input, policy)
    report = build.report
    history = build.document.section(Section.HISTORY)
    rendered = history.messages if history is not None else ()

    if policy.max_messages is not None:
        assert report.messages_included <= policy.max_messages
    assert report.history_chars == sum(len(message_piece(m)) for m in rendered)
    if policy.max_chars is not None:
        assert report.history_chars <= policy.max_chars

    truncated = {entry.message_id: entry for entry in report.truncated}
    cap = policy.per_message_max_chars
    for message, shown in zip(_included(prompt_input, build), rendered, strict=True):
        entry = truncated.get(message.message_id)
        source = message.error if message.failed and message.error is not None else message.text
        if entry is None:
            assert shown.content == source
            assert cap is None or len(source) <= cap
            continue
        assert cap is None or entry.kept_chars <= cap
        assert entry.removed_chars == entry.original_chars - entry.kept_chars > 0
        preview = None if message.failed and message.error is not None else message.preview
        if preview is not None and preview.elisions:  # a kind-aware preview, several markers
            # Cut again the way its kind needs (its evidence first), as every stored preview is.
            assert message.artifact is not None
            shown_preview = recut_preview(preview, cap, message.artifact.kind)
            assert shown.content == shown_preview.text
            assert entry.kept_chars == shown_preview.kept_chars
            assert shown.markers == shown_preview.marker_spans
            continue
        head_of = preview.head if preview is not None else source
        tail_of = preview.tail if preview is not None else source
        assert _is_exact_cut(shown.content, entry.removed_chars, entry.kept_chars, head_of, tail_of)

    block = history.summary if history is not None else None
    assert (block is not None) == report.summary_included
    if block is not None:
        summary = prompt_input.summary
        assert summary is not None and history is not None and history.notice is not None
        assert (block.first_message_id, block.last_message_id) == (
            summary.first_message_id,
            summary.last_message_id,
        )
        whole = summary.total_chars if summary.total_chars is not None else len(summary.text)
        kept = whole - report.summary_removed_chars
        assert kept > 0 and (policy.summary_max_chars is None or kept <= policy.summary_max_chars)
        assert (block.artifact is not None) == (report.summary_removed_chars > 0)
        if report.summary_removed_chars == 0:
            assert block.content == summary.text
        elif summary.preview is None:
            assert _is_exact_cut(
                block.content, report.summary_removed_chars, kept, summary.text, summary.text
            )

    current = build.document.section(Section.CURRENT)
    if current is not None and "Current Message" in report.sections:
        text = prompt_input.current.text
        shown = current.messages[0].content
        if report.current_truncated:
            kept = len(text) - report.current_removed_chars
            cap = policy.current_message_max_chars
            assert cap is None or kept <= cap
            assert _is_exact_cut(shown, report.current_removed_chars, kept, text, text)
        else:
            assert shown == text
    previous = build.document.section(Section.PREVIOUS_RESULT)
    if previous is not None:
        text = prompt_input.previous_result or ""
        shown = previous.messages[0].content
        if report.previous_result_truncated:
            kept = len(text) - report.previous_result_removed_chars
            cap = policy.previous_result_max_chars
            assert cap is None or kept <= cap
            assert _is_exact_cut(shown, report.previous_result_removed_chars, kept, text, text)
        else:
            assert shown == text


@BUILD_SETTINGS
@given(prompt_input=prompt_inputs(), policy=policies())
def test_report_counts_are_consistent(prompt_input: PromptInput, policy: PromptPolicy) -> None:
    build = build_prompt(prompt_input, policy)
    report = build.report
    assert report.messages_included + report.messages_omitted == report.messages_considered
    assert report.omitted_user + report.omitted_assistant == report.messages_omitted
    history = build.document.section(Section.HISTORY)
    if history is None:
        assert report.messages_included == 0
    else:
        assert len(history.messages) == report.messages_included
        notice = history.notice
        assert (notice is not None) == (report.messages_omitted > 0)
        if notice is not None:
            assert (notice.omitted, notice.user, notice.assistant) == (
                report.messages_omitted,
                report.omitted_user,
                report.omitted_assistant,
            )
    included = _included(prompt_input, build)
    assert report.included_message_ids == tuple(sorted(report.included_message_ids))
    shown = [
        pointer.artifact_id
        for section in build.document.sections
        for pointer in [
            section.summary.artifact if section.summary is not None else None,
            *(message.artifact for message in section.messages),
        ]
        if pointer is not None
    ]
    assert report.artifacts == tuple(dict.fromkeys(shown))
    first = prompt_input.first_user_index
    if policy.keep_first_user_message and first is not None and included:
        # The pinned message is the last thing dropped.
        assert report.first_user_message_pinned
        pinned = prompt_input.history[first]
        assert pinned.role is Role.USER and pinned.message_id in report.included_message_ids


@BUILD_SETTINGS
@given(prompt_input=prompt_inputs(), policy=policies())
def test_same_input_gives_the_same_bytes(prompt_input: PromptInput, policy: PromptPolicy) -> None:
    first = build_prompt(prompt_input, policy)
    again = build_prompt(PromptInput.model_validate(prompt_input.model_dump()), policy)
    assert again.text == first.text
    assert again.report == first.report


@BUILD_SETTINGS
@given(
    prompt_input=prompt_inputs(),
    policy=policies() | token_policies(),
    field=st.sampled_from(["max_chars", "max_tokens", "max_messages"]),
    growth=st.integers(1, 3_000),
)
def test_a_larger_budget_never_includes_fewer_messages(
    prompt_input: PromptInput, policy: PromptPolicy, field: str, growth: int
) -> None:
    value = getattr(policy, field)
    larger = policy.model_copy(update={field: None if value is None else value + growth})
    small = build_prompt(prompt_input, policy).report.messages_included
    large = build_prompt(prompt_input, larger).report.messages_included
    assert large >= small


# An independent reader's eye, deliberately written apart from `escaping`: what a model would take
# for a header, a speaker label, a pointer, a notice or the note, once invisible characters,
# accents, width, case and a few common homoglyphs no longer tell lines apart.
_READER_HOMOGLYPHS = str.maketrans("аеорсухАЕОРСУХіІѕЅԁοαΟΑ", "aeopcyxAEOPCYXiIsSdoaOA")
_READER_STRUCTURE = re.compile(
    r"(?:#+\s*(?:conversation history|current message|previous result)"
    r"|(?:user|assistant|human|system)\s*(?:\[[^\]]*\])?\s*:"
    r"|\[\s*(?:artifact|omitted|note|summary)\b)"
)


def _reader_sees_structure(line: str) -> bool:
    if line.startswith("\\"):
        return False  # the note says: a line starting with a backslash is quoted text
    text = unicodedata.normalize("NFKD", line.translate(_READER_HOMOGLYPHS))
    text = "".join(c for c in text if unicodedata.category(c) not in ("Cf", "Mn", "Cc"))
    text = unicodedata.normalize("NFKC", text).casefold().lstrip()
    return _READER_STRUCTURE.match(text) is not None


@BUILD_SETTINGS
@given(prompt_input=prompt_inputs(), policy=policies() | token_policies())
def test_a_reader_sees_exactly_the_real_structure(
    prompt_input: PromptInput, policy: PromptPolicy
) -> None:
    """However content imitates structure, the lines a model takes for structure are real."""
    build = build_prompt(prompt_input, policy)
    document = build.document
    if document.verbatim:
        real = 0
    else:
        real = int(document.escape_note) + sum(
            1  # the header
            + (section.notice is not None)
            + (0 if section.summary is None else 1 + (section.summary.artifact is not None))
            + sum(1 + (message.artifact is not None) for message in section.messages)
            for section in document.sections
        )
    seen = sum(_reader_sees_structure(line) for line in build.text.splitlines())
    assert seen == real


@BUILD_SETTINGS
@given(prompt_input=prompt_inputs(), policy=policies() | token_policies())
def test_the_window_never_opens_with_an_answer_whose_question_was_left_out(
    prompt_input: PromptInput, policy: PromptPolicy
) -> None:
    build = build_prompt(prompt_input, policy)
    history = prompt_input.history
    position = {message.message_id: index for index, message in enumerate(history)}
    included = [position[message_id] for message_id in build.report.included_message_ids]
    pinned = prompt_input.first_user_index if build.report.first_user_message_pinned else None
    window = sorted(index for index in included if index != pinned)
    if not window or history[window[0]].role is Role.USER:
        return
    oldest = window[0]
    unloaded = prompt_input.earlier_user_messages + prompt_input.earlier_assistant_messages
    assert (oldest == 0 and unloaded == 0) or oldest - 1 in included


@BUILD_SETTINGS
@given(prompt_input=prompt_inputs(), policy=policies() | token_policies())
def test_every_cut_points_to_the_whole_text(
    prompt_input: PromptInput, policy: PromptPolicy
) -> None:
    """Nothing cut without a way back: each cut message of every section ends with a pointer,
    to its stored artifact or to the content address of exactly the text that was cut."""
    try:
        build = build_prompt(prompt_input, policy)
    except PromptBudgetError:
        return
    report = build.report
    whole = {(item.pointer.artifact_id, item.message_id): item for item in build.whole_texts}
    for item in build.whole_texts:
        assert content_pointer(item.text) == item.pointer
        assert item.pointer.artifact_id in report.artifacts
    history = build.document.section(Section.HISTORY)
    by_id = {message.message_id: message for message in prompt_input.history}
    shown = dict(zip(report.included_message_ids, history.messages if history else (), strict=True))
    for cut in report.truncated:
        source, message = by_id[cut.message_id], shown[cut.message_id]
        if source.shows_error:
            continue  # an error shown instead of the turn's text is not the turn's artifact
        assert message.artifact is not None
        if source.artifact is not None:
            assert message.artifact == source.artifact
        else:
            assert whole[(message.artifact.artifact_id, source.message_id)].text == source.text
    current = build.document.section(Section.CURRENT)
    if report.current_truncated:
        assert current is not None
        [message] = current.messages
        assert message.artifact is not None
        if prompt_input.current.artifact is None:
            key = (message.artifact.artifact_id, prompt_input.current.message_id)
            assert whole[key].text == prompt_input.current.text
    if report.summary_removed_chars:
        assert history is not None and history.summary is not None
        assert prompt_input.summary is not None
        assert history.summary.artifact == prompt_input.summary.artifact
    previous = build.document.section(Section.PREVIOUS_RESULT)
    if report.previous_result_truncated and (
        prompt_input.previous_result_artifact or prompt_input.previous_result_message_id
    ):
        assert previous is not None
        [message] = previous.messages
        assert message.artifact is not None
    if build.report.verbatim:
        assert not report.current_truncated


@BUILD_SETTINGS
@given(prompt_input=prompt_inputs(), policy=policies() | token_policies())
def test_only_real_cuts_read_as_truncation_markers(
    prompt_input: PromptInput, policy: PromptPolicy
) -> None:
    """A marker a user typed never passes for a cut: in every message body of the prompt, the
    only marker-like text without a backslash after its ellipsis is the cut's own."""
    try:
        build = build_prompt(prompt_input, policy)
    except PromptBudgetError:
        return
    if build.report.verbatim:
        [section] = build.document.sections
        assert not escaping.typed_markers(section.messages[0].content)
        return
    for section in build.document.sections:
        bodies = [*section.messages, *([section.summary] if section.summary else [])]
        for message in bodies:
            body = escape_content(message.content, keep=message.markers)
            unescaped = [m for m in escaping.typed_markers(body) if not m.escaped]
            assert len(unescaped) <= len(message.markers)


@BUILD_SETTINGS
@given(prompt_input=prompt_inputs(), policy=policies() | token_policies())
def test_a_summary_never_changes_which_messages_are_included(
    prompt_input: PromptInput, policy: PromptPolicy
) -> None:
    """The summary gives way first: with or without it, a build includes the same messages,
    and it appears only after an omission notice."""
    try:
        build = build_prompt(prompt_input, policy)
    except PromptBudgetError:
        return
    without = build_prompt(prompt_input.model_copy(update={"summary": None}), policy)
    assert build.report.included_message_ids == without.report.included_message_ids
    history = build.document.section(Section.HISTORY)
    if history is not None and history.summary is not None:
        assert history.notice is not None
        assert build.report.summary_tokens <= build.report.history_tokens
    else:
        assert build.text == without.text
