"""Writing and reading artifact content through Django's storage API.

Content is written once under a key derived from its sha256 (`ab/abcdef....txt`). The text is
hashed in chunks (`content_address`) and, when it must be written, encoded in chunks into a
spooled temporary file, so a 50 MB result never exists as several in-memory copies, and the
storage backend receives an ordinary file (any backend works, filesystem or S3-compatible).

Only the storage API is used here (exists, open, save, delete, listdir, size, modified time),
never a local path. This module knows nothing of rows: which writer may write a key, and when
a file may be removed, is decided by whoever holds the key's artifact row
(`backend.artifacts.services`, `backend.artifacts.retention`).
"""

from __future__ import annotations

import errno
import hashlib
import logging
import re
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass

from django.core.files import File
from django.core.files.storage import Storage, storages

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


def _hash_stored(storage: Storage, key: str) -> str:
    digest = hashlib.sha256()
    with storage.open(key, "rb") as stored:
        while chunk := stored.read(READ_CHUNK_BYTES):
            digest.update(chunk)
    return digest.hexdigest()


def ensure_stored(*, text: str, address: ContentAddress) -> bool:
    """Make the file at `address` hold `text`; True when it had to be written.

    The caller must hold the address (its artifact row inserted or locked in the caller's
    transaction, `services.store_artifacts`): then no other writer and no removal touches the key
    meanwhile, so a damaged file found there may be replaced, and a half-written one removed.
    An existing file is trusted only after its hash is checked. A write that fails (a full disk,
    an unreachable object store) raises ArtifactStorageError and leaves no file at the key.
    """
    storage = artifact_storage()
    key = address.storage_key
    if storage.exists(key):
        if _hash_stored(storage, key) == address.sha256:
            return False
        logger.warning("artifact content at %s is damaged; rewriting it", key)
        storage.delete(key)
    with tempfile.SpooledTemporaryFile(max_size=SPOOL_MAX_BYTES) as spool:
        for chunk in _encoded_chunks(text):
            spool.write(chunk)
        spool.seek(0)
        try:
            saved_key = storage.save(key, File(spool, name=key))
        except Exception as error:
            _write_failed(storage, address=address, error=error)
            raise ArtifactStorageError(
                f"Artifact storage could not take a {address.size_bytes}-byte write "
                f"({_error_name(error)}); nothing was recorded. Retry later."
            ) from error
    if saved_key != key:
        # Only a writer that did not hold the address can have put a file at the key since the
        # check; keep theirs if it is whole, and drop our duplicate either way.
        storage.delete(saved_key)
        if _hash_stored(storage, key) != address.sha256:
            raise ArtifactIntegrityError(f"content at {key} does not match its sha256")
    return True


def _error_name(error: Exception) -> str:
    """`ENOSPC` for an OSError that has an errno, else the exception's type: never its text,
    which may name paths or quote a backend's answer."""
    if isinstance(error, OSError) and error.errno is not None:
        return errno.errorcode.get(error.errno, str(error.errno))
    return type(error).__name__


def _write_failed(storage: Storage, *, address: ContentAddress, error: Exception) -> None:
    """Remove what a failed save left at the key (FileSystemStorage keeps a partial file)."""
    log_event(
        "artifact_write_failed",
        level=logging.ERROR,
        artifact=artifact_id_for(address.sha256),
        size_bytes=address.size_bytes,
        error=_error_name(error),
    )
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
    raises ArtifactIntegrityError instead of sending wrong bytes.
    """
    storage = artifact_storage()
    try:
        actual = _hash_stored(storage, storage_key)
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
