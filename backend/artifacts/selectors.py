"""Selectors that read artifacts: the dispatch manifest, and verified content.

They return models and plain data; where content is downloaded from is the API's business
(`backend.api.artifact_serializers` builds the URLs from the request).

Who may read an artifact is not decided here: access follows the tasks that produced or
reference it (`backend.tasks.artifact_access`); this package knows nothing of tasks.

Content is served only after the stored object has been hashed whole and matched against the
recorded sha256, so a damaged or missing file is an error, never wrong bytes (docs/architecture.md,
principle 2). The same pass finds the byte offsets of a requested line slice, so serving
`?lines=` or a byte range costs one verifying read plus the slice itself.

A composite artifact has no stored object of its own: its content is its parts' files read one
after the other. Each part's file is hashed whole against that part's sha256, and the
composite's sha256 against its parts' (`services.composite_sha256`), so the same guarantee holds;
line offsets and byte ranges are found in the bytes of the whole, across the parts' boundaries.
"""

from __future__ import annotations

import bisect
import hashlib
import itertools
import logging
from collections.abc import Iterator, Sequence
from contextlib import ExitStack
from dataclasses import dataclass
from typing import IO, Protocol

from django.core.files.storage import Storage

from backend.artifacts.models import Artifact, ArtifactPart
from backend.artifacts.services import composite_sha256
from backend.artifacts.storage import READ_CHUNK_BYTES, ArtifactIntegrityError, artifact_storage
from backend.errors import NotFound, NotSatisfiable

logger = logging.getLogger(__name__)

# What an executor needs to materialize an artifact in its workspace and check it.
MANIFEST_FIELDS = ("id", "sha256", "kind", "size_bytes", "size_chars", "size_lines")


@dataclass(frozen=True, slots=True)
class ManifestPart:
    """One part of a composite file a manifest lists, or a list of more files (an executor
    fetches it by id and checks it against its sha256)."""

    id: str
    sha256: str
    size_bytes: int


@dataclass(frozen=True, slots=True)
class ManifestEntry:
    """One file a dispatch payload lists: an artifact (its `MANIFEST_FIELDS`) at the workspace
    path where the prompt, or the history files, say it is. Plain data, so a payload can list
    many files without a model instance each."""

    id: str
    sha256: str
    kind: str
    size_bytes: int
    size_chars: int
    size_lines: int
    workspace_path: str
    # A composite artifact's parts, in order: the file at `workspace_path` is their bytes.
    parts: tuple[ManifestPart, ...] | None = None

    @classmethod
    def of(cls, artifact: Artifact, *, workspace_path: str) -> ManifestEntry:
        return cls(
            id=artifact.id,
            sha256=artifact.sha256,
            kind=artifact.kind,
            size_bytes=artifact.size_bytes,
            size_chars=artifact.size_chars,
            size_lines=artifact.size_lines,
            workspace_path=workspace_path,
        )


class LinesNotSatisfiable(NotSatisfiable):
    """A `?lines=` slice starts after the artifact's last line (the API answers 416)."""

    code = "lines_not_satisfiable"


class RangeNotSatisfiable(NotSatisfiable):
    """A byte range starts past the end of the content (416, with `Content-Range: bytes */SIZE`)."""

    code = "range_not_satisfiable"

    def __init__(self, message: str, *, size_bytes: int) -> None:
        super().__init__(message)
        self.size_bytes = size_bytes


@dataclass(frozen=True)
class LineRange:
    """A 1-based, inclusive slice of lines; `end` None means through the last line."""

    start: int
    end: int | None = None


@dataclass(frozen=True)
class ByteRange:
    """A satisfiable byte slice: `start` inclusive, `end` exclusive."""

    start: int
    end: int


def manifest_artifacts(*, artifact_ids: Sequence[str]) -> list[Artifact]:
    """The artifacts a dispatch payload lists, in the order given, each once (one query).

    Only the manifest fields are loaded (`MANIFEST_FIELDS`). The ids come from turns, whose
    references are protected, so an unknown id is a bug upstream: it raises NotFound naming the
    ids rather than sending a prompt whose pointer leads to a file the workspace will not have.
    """
    ordered_ids = list(dict.fromkeys(artifact_ids))
    if not ordered_ids:
        return []
    by_id = {
        artifact.id: artifact
        for artifact in Artifact.objects.filter(id__in=ordered_ids).only(*MANIFEST_FIELDS)
    }
    missing = [artifact_id for artifact_id in ordered_ids if artifact_id not in by_id]
    if missing:
        raise NotFound(f"Artifacts {', '.join(missing)} do not exist.", field="artifact_ids")
    return [by_id[artifact_id] for artifact_id in ordered_ids]


class SeekableContent(Protocol):
    """What `ArtifactContent` streams from: a stored file, or a composite's parts read as one."""

    def seek(self, offset: int, /) -> int: ...

    def read(self, size: int, /) -> bytes: ...

    def close(self) -> None: ...


class ArtifactContent:
    """Verified content, open and positioned: iterate it for the slice's bytes, then close it.

    StreamingHttpResponse calls `close()` when the response is done, sent or not, so the
    stored object is never left open.
    """

    def __init__(
        self,
        *,
        stored: SeekableContent,
        start: int,
        end: int,
        size_bytes: int,
        lines: LineRange | None = None,
        total_lines: int | None = None,
    ) -> None:
        self._stored = stored
        self.start = start
        self.end = end
        self.size_bytes = size_bytes
        # For a line slice: the lines it covers (`end` clamped to the last line), of how many.
        self.lines = lines
        self.total_lines = total_lines

    @property
    def length(self) -> int:
        return self.end - self.start

    def __iter__(self) -> Iterator[bytes]:
        try:
            self._stored.seek(self.start)
            remaining = self.length
            while remaining > 0:
                chunk = self._stored.read(min(READ_CHUNK_BYTES, remaining))
                if not chunk:
                    break
                remaining -= len(chunk)
                yield chunk
        finally:
            self.close()

    def close(self) -> None:
        self._stored.close()


def artifact_content(
    *,
    artifact: Artifact,
    byte_range: ByteRange | None = None,
    line_range: LineRange | None = None,
) -> ArtifactContent:
    """The artifact's verified content, or the requested byte or line slice of it.

    Hashes the whole stored object before returning (raising ArtifactIntegrityError, logged with
    the id, when it is missing or does not match), and in the same pass finds where the
    requested lines start and end. Lines are counted as at ingestion: split on "\\n", a last
    line without a trailing newline still counts. Raises LinesNotSatisfiable when `line_range`
    starts after the last line. (`storage.verified_chunks` streams from the first byte only; a
    slice needs its offsets before the response headers go out, and a seek to its start.)

    A composite is served from its parts' files, every one opened and hashed whole (and its
    parts checked against its sha256) before returning, and closed with the content; finding
    its parts costs one query per level of nesting (none for a plain artifact).
    """
    pieces = _stored_pieces(artifact)
    storage = artifact_storage()
    opened: list[IO[bytes]] = []
    try:
        finder = _LineOffsets(line_range) if line_range is not None else None
        size = 0
        piece_sizes = []
        for piece in pieces:
            stored = _open_stored(storage, artifact=artifact, piece=piece)
            opened.append(stored)
            digest = hashlib.sha256()
            piece_start = size
            while chunk := stored.read(READ_CHUNK_BYTES):
                digest.update(chunk)
                if finder is not None:
                    finder.feed(chunk, offset=size)
                size += len(chunk)
            if digest.hexdigest() != piece.sha256:
                raise _integrity_error(
                    artifact, f"{_stored_content(artifact, piece)} fails its sha256 check"
                )
            piece_sizes.append(size - piece_start)
        if size != artifact.size_bytes and artifact.composite:
            # The view resolved the byte range against the recorded size: it must be the size.
            raise _integrity_error(
                artifact, f"its parts hold {size} bytes, not its recorded {artifact.size_bytes}"
            )
        if finder is not None:
            start, end, lines, total_lines = finder.result(size_bytes=size, artifact_id=artifact.id)
        elif byte_range is not None:
            start, end, lines, total_lines = byte_range.start, byte_range.end, None, None
        else:
            start, end, lines, total_lines = 0, size, None, None
    except BaseException:
        _close_all(opened)
        raise
    content: SeekableContent = (
        opened[0] if len(opened) == 1 else _ConcatenatedFiles(opened, sizes=piece_sizes)
    )
    return ArtifactContent(
        stored=content,
        start=start,
        end=end,
        size_bytes=size,
        lines=lines,
        total_lines=total_lines,
    )


def _stored_pieces(artifact: Artifact) -> list[Artifact]:
    """The artifacts whose stored files, read in order, are `artifact`'s content: the artifact
    itself, or a composite's parts, a part that is itself a composite replaced by its own.

    One query per level of nesting. Each composite's sha256 is checked against its parts'
    (`composite_sha256`) before they are used, so parts that are not the ones it was made of
    are an ArtifactIntegrityError, like a damaged file. (That check also rules out a cycle: a
    composite would have to be a part of its own digest.)
    """
    pieces = [artifact]
    while composites := {piece.pk: piece for piece in pieces if piece.composite}:
        parts: dict[str, list[Artifact]] = {pk: [] for pk in composites}
        for link in (
            ArtifactPart.objects.filter(composite_id__in=list(composites))
            .select_related("part")
            .order_by("composite_id", "position")
        ):
            parts[link.composite_id].append(link.part)
        for pk, composite in composites.items():
            if composite_sha256([part.sha256 for part in parts[pk]]) != composite.sha256:
                raise _integrity_error(
                    artifact,
                    "its parts do not match its sha256"
                    if pk == artifact.pk
                    else f"the parts of its part {pk} do not match that part's sha256",
                )
        pieces = [part for piece in pieces for part in parts.get(piece.pk, [piece])]
    return pieces


def _open_stored(storage: Storage, *, artifact: Artifact, piece: Artifact) -> IO[bytes]:
    try:
        stored: IO[bytes] = storage.open(piece.storage_key, "rb")
    except FileNotFoundError:
        raise _integrity_error(artifact, f"{_stored_content(artifact, piece)} is missing") from None
    return stored


def _stored_content(artifact: Artifact, piece: Artifact) -> str:
    """How an error names a stored file of `artifact`'s: its own, or one of its parts'."""
    if piece.pk == artifact.pk:
        return "its stored content"
    return f"the stored content of its part {piece.id}"


def _integrity_error(artifact: Artifact, problem: str) -> ArtifactIntegrityError:
    """Log why `artifact` cannot be served (with its id; never a byte of its content) and
    return the error to raise."""
    logger.error("artifact %s: %s", artifact.id, problem)
    return ArtifactIntegrityError(f"Artifact {artifact.id} cannot be served: {problem}.")


def _close_all(files: Sequence[IO[bytes]]) -> None:
    """Close every file, even when closing one fails (the last failure is raised)."""
    with ExitStack() as stack:
        for file in files:
            stack.callback(file.close)


class _ConcatenatedFiles:
    """A composite's part files, opened and verified, read as one: `seek` to an offset in the
    whole, `read` across the boundaries between parts; `close` closes every part.

    Only a chunk is ever in memory: a read takes what it needs from one part after another.
    """

    def __init__(self, files: Sequence[IO[bytes]], *, sizes: Sequence[int]) -> None:
        self._files = files
        # Where each part ends in the whole; a part starts where the one before it ends.
        self._ends = list(itertools.accumulate(sizes))
        self._position = 0

    def seek(self, offset: int, /) -> int:
        self._position = offset
        return offset

    def read(self, size: int, /) -> bytes:
        chunks: list[bytes] = []
        wanted = size
        while wanted > 0:
            # The first part that ends after the position (empty parts end where they start).
            index = bisect.bisect_right(self._ends, self._position)
            if index == len(self._files):
                break
            part_start = self._ends[index - 1] if index else 0
            file = self._files[index]
            file.seek(self._position - part_start)
            chunk = file.read(min(wanted, self._ends[index] - self._position))
            if not chunk:
                break
            chunks.append(chunk)
            self._position += len(chunk)
            wanted -= len(chunk)
        return b"".join(chunks)

    def close(self) -> None:
        _close_all(self._files)


class _LineOffsets:
    """Finds the byte offsets of a line slice while the content streams past once.

    Line N starts after the (N-1)th newline and ends after the Nth (or at the end of the
    content). A newline byte never occurs inside a multibyte UTF-8 sequence, so offsets on
    newline boundaries never split a character.
    """

    def __init__(self, line_range: LineRange) -> None:
        self.line_range = line_range
        self.newlines = 0
        self.last_byte = b""
        # Byte offsets once found; the start of line 1 is the start of the content.
        self.start: int | None = 0 if line_range.start == 1 else None
        self.end: int | None = None

    def feed(self, chunk: bytes, *, offset: int) -> None:
        self.last_byte = chunk[-1:]
        found = chunk.count(b"\n")
        wanted = [self.line_range.start - 1]  # the newline that ends the line before START
        if self.line_range.end is not None:
            wanted.append(self.line_range.end)  # the newline that ends line END
        for target in wanted:
            if target < 1 or not self.newlines < target <= self.newlines + found:
                continue
            position = -1
            for _ in range(target - self.newlines):
                position = chunk.index(b"\n", position + 1)
            if target == self.line_range.start - 1:
                self.start = offset + position + 1
            else:
                self.end = offset + position + 1
        self.newlines += found

    def result(self, *, size_bytes: int, artifact_id: str) -> tuple[int, int, LineRange, int]:
        total_lines = self.newlines + (1 if size_bytes and self.last_byte != b"\n" else 0)
        if self.line_range.start > total_lines:
            raise LinesNotSatisfiable(
                f"lines starts at line {self.line_range.start}, but artifact {artifact_id} has "
                f"{total_lines} lines.",
                field="lines",
            )
        last = total_lines if self.line_range.end is None else min(self.line_range.end, total_lines)
        start = self.start if self.start is not None else size_bytes
        end = self.end if self.end is not None else size_bytes
        return start, end, LineRange(start=self.line_range.start, end=last), total_lines
