"""Writing and reading artifact content through Django's storage API.

Content is written once under a key derived from its sha256 (`ab/abcdef....txt`). The text is
hashed in chunks (`content_address`) and, when it must be written, encoded in chunks into a
spooled temporary file, so a 50 MB result never exists as several in-memory copies, and the
storage backend receives an ordinary file (any backend works, filesystem or S3-compatible).
Text that arrives as a stream of UTF-8 (a result value a worker uploads) is never held whole:
`spool_text` checks, hashes and measures it chunk by chunk into such a file, which is then
stored as it is, and `read_text_ends` reads back only the two ends of a stored text.

Only the storage API is used here (exists, open, save, delete, listdir, size, modified time),
never a local path; `probe_storage` checks that the storage works at all. This module knows
nothing of rows: which writer may write a key, and when a file may be removed, is decided by
whoever holds the key's artifact row (`backend.artifacts.services`,
`backend.artifacts.retention`).
"""

from __future__ import annotations

import codecs
import errno
import hashlib
import logging
import re
import secrets
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import IO, Protocol

from django.core.files import File
from django.core.files.base import ContentFile
from django.core.files.storage import Storage, storages

from backend.errors import InvalidInput, PayloadTooLarge
from backend.events import log_event
from backend.prompting.addressing import artifact_id_for

logger = logging.getLogger(__name__)

ENCODE_CHUNK_CHARS = 1 << 20
READ_CHUNK_BYTES = 1 << 20
SPOOL_MAX_BYTES = 4 << 20

# The layout `ensure_stored` writes: a two-hex-digit directory per sha256 prefix, and in it the
# canonical `<sha256>.txt` or, when a storage backend chose another free name for a save,
# `<sha256>_<suffix>.txt`. Nothing else in the storage is ever listed or removed.
_SHARD = re.compile(r"[0-9a-f]{2}")
_STORED_NAME = re.compile(r"(?P<sha256>[0-9a-f]{64})(?P<suffix>_[A-Za-z0-9]+)?\.txt")


class ArtifactIntegrityError(RuntimeError):
    """Stored content is missing or does not match its recorded sha256.

    A server-side fault that retrying will not fix: the API answers 500 with this code.
    """

    code = "artifact_integrity"


class ArtifactStorageError(RuntimeError):
    """The artifact storage failed to take a write (a full disk, a quota, an unreachable store).

    Nothing is left of the write, and the transaction that needed it rolls back, so nothing was
    recorded: the API answers 503 with this code, and the same request can be retried.
    """

    code = "storage_unavailable"


@dataclass(frozen=True)
class ContentAddress:
    """Where a text is stored: its sha256, the key derived from it, its size in UTF-8."""

    sha256: str
    storage_key: str
    size_bytes: int
    # False when an intact copy was already stored at the key and this call only checked it.
    written: bool = True


@dataclass(frozen=True)
class StoredFile:
    """A file in the artifact layout: its key, and the sha256 it is the canonical key of (None
    for another name a backend chose for a save, which no artifact row ever names)."""

    storage_key: str
    sha256: str | None


class ByteStream(Protocol):
    """What `spool_text` reads from: a request body, a file."""

    def read(self, size: int = ..., /) -> bytes: ...


@dataclass(frozen=True)
class SpooledText:
    """UTF-8 text received as a stream, checked and measured, in a temporary file: what
    `ensure_stored` writes for it. `lines` counts as `count_lines` does; `nul_chars` is how
    many U+0000 it holds."""

    file: IO[bytes]
    address: ContentAddress
    chars: int
    lines: int
    nul_chars: int


def artifact_storage() -> Storage:
    return storages["artifacts"]


def storage_key_for(sha256: str) -> str:
    return f"{sha256[:2]}/{sha256}.txt"


def _encoded_chunks(text: str) -> Iterator[bytes]:
    for start in range(0, len(text), ENCODE_CHUNK_CHARS):
        yield text[start : start + ENCODE_CHUNK_CHARS].encode("utf-8")


def content_address(text: str) -> ContentAddress:
    """The address of `text` as UTF-8, hashed in chunks; nothing is stored.

    The text must be valid Unicode (no lone surrogates); ingestion replaces those first.
    """
    digest = hashlib.sha256()
    size = 0
    for chunk in _encoded_chunks(text):
        digest.update(chunk)
        size += len(chunk)
    sha256 = digest.hexdigest()
    return ContentAddress(sha256=sha256, storage_key=storage_key_for(sha256), size_bytes=size)


@contextmanager
def spool_text(stream: ByteStream, *, max_bytes: int, field: str) -> Iterator[SpooledText]:
    """The stream's bytes, read to its end in chunks, as UTF-8 text in a temporary file (closed
    when the block ends), with its content address and sizes.

    Nothing but one chunk is ever in memory: each is checked as UTF-8 (a sequence cut between
    two chunks is completed by the next), hashed, counted and written to a spooled file that
    moves to disk past SPOOL_MAX_BYTES. Bytes that are not UTF-8 are InvalidInput naming
    `field` and the byte's offset; more than `max_bytes` bytes are PayloadTooLarge naming
    `field` (reading stops there).
    """
    decoder = codecs.getincrementaldecoder("utf-8")("strict")
    digest = hashlib.sha256()
    size = chars = breaks = nuls = 0
    last = b""
    with tempfile.SpooledTemporaryFile(max_size=SPOOL_MAX_BYTES) as spool:
        while True:
            chunk = stream.read(READ_CHUNK_BYTES)
            pending = len(decoder.getstate()[0])  # the start of a sequence the last chunk cut
            try:
                chars += len(decoder.decode(chunk, final=not chunk))
            except UnicodeDecodeError as error:
                offset = size - pending + error.start
                raise InvalidInput(
                    f"{field} is not valid UTF-8 (byte {offset}: {error.reason}).", field=field
                ) from None
            if not chunk:
                break
            size += len(chunk)
            if size > max_bytes:
                raise PayloadTooLarge(
                    f"{field} is more than {max_bytes} bytes of UTF-8; the limit is {max_bytes} "
                    "bytes.",
                    field=field,
                )
            digest.update(chunk)
            breaks += chunk.count(b"\n")
            nuls += chunk.count(b"\0")
            last = chunk[-1:]
            spool.write(chunk)
        spool.seek(0)
        sha256 = digest.hexdigest()
        yield SpooledText(
            file=spool,
            address=ContentAddress(
                sha256=sha256, storage_key=storage_key_for(sha256), size_bytes=size
            ),
            chars=chars,
            lines=breaks + (1 if size and last != b"\n" else 0),
            nul_chars=nuls,
        )


def read_text(file: IO[bytes]) -> str:
    """The whole UTF-8 text of `file`, from its start."""
    file.seek(0)
    return file.read().decode("utf-8")


def read_text_ends(
    file: IO[bytes], *, size_bytes: int, chars: int, chunk_bytes: int = READ_CHUNK_BYTES
) -> tuple[str, str]:
    """The first and the last `chars` code points of the UTF-8 text in `file` (`size_bytes`
    long), read in chunks from each end: what lies between is never read."""
    decoder = codecs.getincrementaldecoder("utf-8")("strict")
    file.seek(0)
    head_parts: list[str] = []
    head_chars = 0
    while head_chars < chars and (chunk := file.read(chunk_bytes)):
        part = decoder.decode(chunk)
        head_parts.append(part)
        head_chars += len(part)
    head = "".join(head_parts)[:chars]
    del head_parts
    tail_parts: list[bytes] = []
    tail_chars = 0
    start = size_bytes
    while tail_chars < chars and start > 0:
        end, start = start, max(0, start - chunk_bytes)
        file.seek(start)
        chunk = file.read(end - start)
        tail_parts.append(chunk)
        # A code point is one byte that is not a continuation byte (10xxxxxx).
        tail_chars += len(chunk) - len(chunk.translate(None, _NOT_CONTINUATION))
    data = b"".join(reversed(tail_parts))
    del tail_parts
    skip = 0
    while skip < len(data) and data[skip] & 0xC0 == 0x80:
        skip += 1  # the rest of a code point that starts before what was read
    tail = data[skip:].decode("utf-8")
    return head, tail[max(len(tail) - chars, 0) :]


# Every byte but the continuation bytes (0x80-0xBF): deleting them leaves the continuations.
_NOT_CONTINUATION = bytes(range(0x80)) + bytes(range(0xC0, 0x100))


def stored_sha256(storage: Storage, key: str) -> str:
    """The sha256 of the file at `key`, read in chunks; FileNotFoundError when there is none."""
    digest = hashlib.sha256()
    with storage.open(key, "rb") as stored:
        while chunk := stored.read(READ_CHUNK_BYTES):
            digest.update(chunk)
    return digest.hexdigest()


def ensure_stored(*, text: str | SpooledText, address: ContentAddress) -> bool:
    """Make the file at `address` hold `text` (a string, or text already spooled to a file);
    True when it had to be written.

    The caller must hold the address (its artifact row inserted or locked in the caller's
    transaction, `services.store_artifacts`): then no other writer and no removal touches the key
    meanwhile, so a damaged file found there may be replaced, and a half-written one removed.
    An existing file is trusted only after its hash is checked. A write that fails (a full disk,
    an unreachable object store) raises ArtifactStorageError and leaves no file at the key; so
    does a storage that cannot even be asked what the key holds.
    """
    storage = artifact_storage()
    key = address.storage_key
    try:
        if storage.exists(key):
            if stored_sha256(storage, key) == address.sha256:
                return False
            logger.warning("artifact content at %s is damaged; rewriting it", key)
            storage.delete(key)
    except Exception as error:
        _log_write_failed(address=address, error=error)
        raise _storage_unavailable(address=address, error=error) from error
    with _spooled(text) as spool:
        try:
            saved_key = storage.save(key, File(spool, name=key))
        except Exception as error:
            _write_failed(storage, address=address, error=error)
            raise _storage_unavailable(address=address, error=error) from error
    if saved_key != key:
        # Only a writer that did not hold the address can have put a file at the key since the
        # check; keep theirs if it is whole, and drop our duplicate either way.
        storage.delete(saved_key)
        if stored_sha256(storage, key) != address.sha256:
            raise ArtifactIntegrityError(f"content at {key} does not match its sha256")
    return True


@contextmanager
def _spooled(text: str | SpooledText) -> Iterator[IO[bytes]]:
    """`text` as a file from its start: its own spool, or one encoded in chunks."""
    if isinstance(text, SpooledText):
        text.file.seek(0)
        yield text.file
        return
    with tempfile.SpooledTemporaryFile(max_size=SPOOL_MAX_BYTES) as spool:
        for chunk in _encoded_chunks(text):
            spool.write(chunk)
        spool.seek(0)
        yield spool


def _error_name(error: Exception) -> str:
    """`ENOSPC` for an OSError that has an errno, else the exception's type: never its text,
    which may name paths or quote a backend's answer."""
    if isinstance(error, OSError) and error.errno is not None:
        return errno.errorcode.get(error.errno, str(error.errno))
    return type(error).__name__


def _storage_unavailable(*, address: ContentAddress, error: Exception) -> ArtifactStorageError:
    return ArtifactStorageError(
        f"Artifact storage could not take a {address.size_bytes}-byte write "
        f"({_error_name(error)}); nothing was recorded. Retry later."
    )


def _log_write_failed(*, address: ContentAddress, error: Exception) -> None:
    log_event(
        "artifact_write_failed",
        level=logging.ERROR,
        artifact=artifact_id_for(address.sha256),
        size_bytes=address.size_bytes,
        error=_error_name(error),
    )


def _write_failed(storage: Storage, *, address: ContentAddress, error: Exception) -> None:
    """Remove what a failed save left at the key (FileSystemStorage keeps a partial file)."""
    _log_write_failed(address=address, error=error)
    try:
        storage.delete(address.storage_key)
    except Exception:  # noqa: BLE001 - the orphan sweep removes what is left
        logger.exception("artifact %s: could not remove a partial write", address.sha256[:16])


def stored_files() -> Iterator[StoredFile]:
    """Every file in the artifact layout, shard by shard, in key order.

    Lists with `listdir` only (one call per shard directory on an object store).
    """
    storage = artifact_storage()
    try:
        shards, _ = storage.listdir("")
    except FileNotFoundError:
        return  # nothing was ever stored
    for shard in sorted(shards):
        if not _SHARD.fullmatch(shard):
            continue
        _, names = storage.listdir(shard)
        for name in sorted(names):
            match = _STORED_NAME.fullmatch(name)
            if match is None or not match["sha256"].startswith(shard):
                continue
            yield StoredFile(
                storage_key=f"{shard}/{name}",
                sha256=None if match["suffix"] else match["sha256"],
            )


def verified_chunks(*, storage_key: str, sha256: str, artifact_id: str) -> Iterator[bytes]:
    """Check the stored content against its sha256, then yield it in chunks.

    The whole object is hashed before the first byte is handed out, so a corrupted artifact
    raises ArtifactIntegrityError instead of sending wrong bytes. A composite artifact has no
    stored object (its key is empty): it is refused with ValueError, never opened as the
    storage's root; `selectors.artifact_content` reads it from its parts.
    """
    if not storage_key:
        raise ValueError(
            f"artifact {artifact_id} has no stored object of its own (a composite artifact); "
            "read it with artifacts.selectors.artifact_content"
        )
    storage = artifact_storage()
    try:
        actual = stored_sha256(storage, storage_key)
    except FileNotFoundError:
        logger.error("artifact %s: content missing from storage", artifact_id)
        raise ArtifactIntegrityError(f"artifact {artifact_id}: content is missing") from None
    if actual != sha256:
        logger.error("artifact %s: stored content fails its sha256 check", artifact_id)
        raise ArtifactIntegrityError(f"artifact {artifact_id}: content fails its sha256 check")
    return _read_chunks(storage, storage_key)


def _read_chunks(storage: Storage, key: str) -> Iterator[bytes]:
    with storage.open(key, "rb") as stored:
        while chunk := stored.read(READ_CHUNK_BYTES):
            yield chunk


# Where `probe_storage` writes: outside the sha256 shards, so no listing of stored files sees it.
PROBE_DIRECTORY = "health"


def probe_storage() -> None:
    """Write a small random file to the artifact storage, read it back and delete it.

    Proves that the storage takes writes and serves reads (the health endpoint asks); raises
    what the backend raises when it does not, and ArtifactIntegrityError when the file reads
    back different. Each probe has a name of its own, so concurrent probes never meet; a probe
    file a crash left behind is a few bytes under `health/`.
    """
    storage = artifact_storage()
    token = secrets.token_hex(8)
    name = storage.save(f"{PROBE_DIRECTORY}/probe-{token}.txt", ContentFile(token.encode()))
    try:
        with storage.open(name, "rb") as file:
            read_back = file.read()
    finally:
        storage.delete(name)
    if read_back != token.encode():
        raise ArtifactIntegrityError(f"the probe file {name} read back different")
