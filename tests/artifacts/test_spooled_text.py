"""Text that arrives as a stream: checked, hashed and measured chunk by chunk into a spool, and
read back from either end without reading the middle."""

from __future__ import annotations

import io

import pytest
from hypothesis import given
from hypothesis import strategies as st

from backend.artifacts.storage import content_address, read_text, read_text_ends, spool_text
from backend.errors import InvalidInput, PayloadTooLarge
from backend.prompting.addressing import count_lines


class Trickle:
    """A stream that hands out at most `step` bytes per read, whatever was asked for."""

    def __init__(self, data: bytes, step: int) -> None:
        self._data = io.BytesIO(data)
        self._step = step

    def read(self, size: int = -1, /) -> bytes:
        return self._data.read(min(size, self._step) if size >= 0 else self._step)


texts = st.text(
    alphabet=st.characters(blacklist_categories=("Cs",)), max_size=300
) | st.sampled_from(["", "\n", "a\n", "😀", "é\n\n", "x" * 50 + "😀é✓\n" * 9])


@given(text=texts, step=st.integers(1, 9))
def test_a_spooled_text_is_the_text_measured_as_a_string_is(text: str, step: int) -> None:
    data = text.encode()
    with spool_text(Trickle(data, step), max_bytes=len(data), field="value") as spooled:
        assert spooled.address == content_address(text)
        assert (spooled.chars, spooled.lines) == (len(text), count_lines(text))
        assert spooled.nul_chars == text.count("\0")
        assert read_text(spooled.file) == text


@given(
    text=st.text(alphabet=st.characters(blacklist_categories=("Cs",)), min_size=1, max_size=300),
    chars=st.integers(1, 120),
    chunk=st.integers(1, 9),
)
def test_the_ends_read_back_are_the_texts_own(text: str, chars: int, chunk: int) -> None:
    data = text.encode()
    head, tail = read_text_ends(
        io.BytesIO(data), size_bytes=len(data), chars=chars, chunk_bytes=chunk
    )
    assert head == text[:chars]
    assert tail == text[-chars:]


def test_reading_the_ends_of_a_long_text_leaves_its_middle_unread() -> None:
    class Counting(io.BytesIO):
        read_bytes = 0

        def read(self, size: int | None = -1, /) -> bytes:
            chunk = super().read(size)
            self.read_bytes += len(chunk)
            return chunk

    text = "é" * 500_000 + "middle" + "✓" * 500_000
    data = text.encode()
    file = Counting(data)
    assert read_text_ends(file, size_bytes=len(data), chars=10, chunk_bytes=64) == (
        "é" * 10,
        "✓" * 10,
    )
    assert file.read_bytes <= 4 * 64


@pytest.mark.parametrize(
    ("data", "detail"),
    [
        (b"ok\xff", "value is not valid UTF-8 (byte 2: invalid start byte)."),
        (b"\xed\xa0\x80", "value is not valid UTF-8 (byte 0: invalid continuation byte)."),
        (b"ab\xe2\x82", "value is not valid UTF-8 (byte 2: unexpected end of data)."),
    ],
    ids=["a stray byte", "an encoded surrogate", "cut short"],
)
def test_bytes_that_are_not_utf8_are_refused_with_their_offset(data: bytes, detail: str) -> None:
    with (
        pytest.raises(InvalidInput) as refused,
        spool_text(Trickle(data, 1), max_bytes=100, field="value"),
    ):
        pass
    assert (refused.value.message, refused.value.field) == (detail, "value")


def test_a_stream_over_the_limit_is_refused_once_past_it() -> None:
    stream = io.BytesIO(b"x" * 10_000_000)
    with (
        pytest.raises(PayloadTooLarge) as refused,
        spool_text(stream, max_bytes=1_000, field="value"),
    ):
        pass
    assert refused.value.field == "value"
    assert stream.tell() <= 1_000 + (1 << 20)  # reading stopped with the chunk past the limit
