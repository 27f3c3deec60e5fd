"""Writing and reading artifact content through Django's storage API.

Content is written once under a key derived from its sha256 (`ab/abcdef....txt`). The text is
encoded and hashed in chunks into a spooled temporary file, so a 50 MB result never exists as
several in-memory copies, and the storage backend receives an ordinary file (any backend works,
filesystem or S3-compatible). An existing object at the key is trusted only after its hash is
checked: a half-written file from an earlier failure is replaced, never served.
"""

from __future__ import annotations

import hashlib
import logging
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass

from django.core.files import File
from django.core.files.storage import Storage, storages

logger = logging.getLogger(__name__)

ENCODE_CHUNK_CHARS = 1 << 20
READ_CHUNK_BYTES = 1 << 20
SPOOL_MAX_BYTES = 4 << 20


class ArtifactIntegrityError(RuntimeError):
    """Stored content is missing or does not match its recorded sha256.

    A server-side fault that retrying will not fix: the API answers 500 with this code.
    """

    code = "artifact_integrity"


@dataclass(frozen=True)
class StoredContent:
    sha256: str
    storage_key: str
    size_bytes: int
    # False when an intact copy was already stored at the key and this call only checked it.
    written: bool = True


def artifact_storage() -> Storage:
    return storages["artifacts"]


def storage_key_for(sha256: str) -> str:
    return f"{sha256[:2]}/{sha256}.txt"


def _hash_stored(storage: Storage, key: str) -> str:
    digest = hashlib.sha256()
    with storage.open(key, "rb") as stored:
        while chunk := stored.read(READ_CHUNK_BYTES):
            digest.update(chunk)
    return digest.hexdigest()


def store_text(text: str) -> StoredContent:
    """Store `text` as UTF-8 under its content-derived key and return where it is.

    The text must be valid Unicode (no lone surrogates); ingestion replaces those first.
    """
    digest = hashlib.sha256()
    size = 0
    with tempfile.SpooledTemporaryFile(max_size=SPOOL_MAX_BYTES) as spool:
        for start in range(0, len(text), ENCODE_CHUNK_CHARS):
            chunk = text[start : start + ENCODE_CHUNK_CHARS].encode("utf-8")
            digest.update(chunk)
            spool.write(chunk)
            size += len(chunk)
        sha256 = digest.hexdigest()
        key = storage_key_for(sha256)
        storage = artifact_storage()
        if storage.exists(key):
            if _hash_stored(storage, key) == sha256:
                return StoredContent(sha256=sha256, storage_key=key, size_bytes=size, written=False)
            logger.warning("artifact content at %s is damaged; rewriting it", key)
            storage.delete(key)
        spool.seek(0)
        saved_key = storage.save(key, File(spool, name=key))
    if saved_key != key:
        # Another writer stored the same content between our check and our save; keep theirs
        # if it is whole, and drop our duplicate either way.
        storage.delete(saved_key)
        if _hash_stored(storage, key) != sha256:
            raise ArtifactIntegrityError(f"content at {key} does not match sha256 {sha256}")
    return StoredContent(sha256=sha256, storage_key=key, size_bytes=size)


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
