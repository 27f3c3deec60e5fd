"""Artifacts on an S3-compatible object store, read as streams.

django-storages' `S3Storage` opens an object for reading by downloading all of it into a
temporary file. Baton reads artifacts as streams instead: hashed chunk by chunk, or only their
two ends (`storage.read_text_ends`, after a value upload), or a slice after one verifying pass
(`selectors.artifact_content`). `ArtifactS3Storage` opens an object for reading as a seekable
stream: a GET streams the object from the current position, and a seek elsewhere starts a new
ranged GET there. So reading the two ends of a 60 MB text fetches the two ends, and nothing of
an artifact is ever written to local disk.

Every GET of one opened object names the ETag it had when it was opened (If-Match): bytes of
two versions are never mixed, and an object replaced meanwhile fails the read with
ArtifactIntegrityError. Writing, listing and removal are S3Storage's own.
"""

from __future__ import annotations

import io
from typing import Any

from botocore.exceptions import ClientError
from django.core.files import File
from storages.backends.s3 import S3Storage
from storages.utils import clean_name

from backend.artifacts.storage import READ_CHUNK_BYTES, ArtifactIntegrityError


class ObjectReader(io.RawIOBase):
    """One object of a bucket as a seekable, read-only raw stream (wrap it in a BufferedReader).

    `received` counts the bytes taken from the store, for whoever wants to know what a read
    cost.
    """

    def __init__(self, *, client: Any, bucket: str, key: str, size: int, etag: str) -> None:
        super().__init__()
        self._client = client
        self._bucket = bucket
        self._key = key
        self._size = size
        self._etag = etag
        self._position = 0
        self._body: Any = None
        self.received = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._position

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._position, io.SEEK_END: self._size}[whence]
        position = base + offset
        if position < 0:
            raise ValueError(f"negative seek position {position}")
        if position != self._position:
            self._close_body()  # the next read starts a GET at the new position
            self._position = position
        return position

    def readinto(self, buffer: Any) -> int:
        if self._position >= self._size:
            return 0
        if self._body is None:
            self._body = self._get_from(self._position)
        data = self._body.read(len(buffer))
        if not data:
            raise ArtifactIntegrityError(
                f"object {self._key} ended at byte {self._position} of {self._size}"
            )
        count = len(data)
        memoryview(buffer)[:count] = data
        self._position += count
        self.received += count
        return count

    def close(self) -> None:
        self._close_body()
        super().close()

    def _get_from(self, position: int) -> Any:
        try:
            response = self._client.get_object(
                Bucket=self._bucket,
                Key=self._key,
                Range=f"bytes={position}-",
                IfMatch=self._etag,
            )
        except ClientError as error:
            if _status(error) in (404, 412):
                raise ArtifactIntegrityError(
                    f"object {self._key} was replaced or removed while it was read"
                ) from None
            raise
        return response["Body"]

    def _close_body(self) -> None:
        if self._body is not None:
            self._body.close()
            self._body = None


class ArtifactS3Storage(S3Storage):  # type: ignore[misc]  # django-storages ships no types
    """S3Storage whose files open for reading as streams (`ObjectReader`)."""

    def _open(self, name: str, mode: str = "rb") -> File[bytes]:
        if mode != "rb":
            return super()._open(name, mode)  # type: ignore[no-any-return]
        key = self._normalize_name(clean_name(name))
        client = self.connection.meta.client
        try:
            head = client.head_object(Bucket=self.bucket_name, Key=key)
        except ClientError as error:
            if _status(error) == 404:
                raise FileNotFoundError(f"no object at {name}") from None
            raise
        reader = ObjectReader(
            client=client,
            bucket=self.bucket_name,
            key=key,
            size=head["ContentLength"],
            etag=head["ETag"],
        )
        return File(io.BufferedReader(reader, buffer_size=READ_CHUNK_BYTES), name=name)


def _status(error: ClientError) -> int | None:
    status = error.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
    return int(status) if status is not None else None
