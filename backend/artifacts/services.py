"""Storing text as an artifact: the content once, by its sha256, and the row that names it.

This is storage only. Whether a text is long enough to spill, and what a turn keeps of it
instead, is ingestion's decision (`backend.tasks.ingestion`); this module never looks at turns.

The row is the lock on its content address. A writer inserts the row (or locks the existing
one) before it checks or writes the file, and holds it until its transaction ends; a removal
of the file holds the same address (`retention.remove_unowned_file`). So no file is removed
while a row that needs it is being committed, and two writers of one text never write the same
key at once. A transaction that rolls back after writing a file removes it again when it was
opened with `atomic_storing_artifacts()`; anything a crash leaves behind, the orphan sweep
removes (`retention.remove_orphan_files`).
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Protocol

from django.db import transaction

from backend.artifacts.models import Artifact, ArtifactPart
from backend.artifacts.retention import remove_unowned_file
from backend.artifacts.storage import (
    ArtifactIntegrityError,
    ContentAddress,
    SpooledText,
    artifact_storage,
    content_address,
    ensure_stored,
    stored_sha256,
)
from backend.prompting.addressing import artifact_id_for, count_lines

logger = logging.getLogger(__name__)

# The files written inside the innermost `atomic_storing_artifacts()` block (None outside one).
_files_written: ContextVar[list[ContentAddress] | None] = ContextVar(
    "artifact_files_written", default=None
)


@dataclass(frozen=True)
class ArtifactText:
    """A text to store, its kind, and the task that produced it. The text is a string, or
    text that arrived as a stream and waits, measured, in a temporary file
    (`storage.spool_text`)."""

    text: str | SpooledText
    kind: str
    task_id: int | None
    known_address: ContentAddress | None = None
    """The text's address when the caller has hashed it already (never checked again here:
    the file written is checked against it when it is next read)."""

    def address(self) -> ContentAddress:
        if isinstance(self.text, SpooledText):
            return self.text.address
        return self.known_address or content_address(self.text)


@contextmanager
def atomic_storing_artifacts() -> Iterator[None]:
    """`transaction.atomic()` whose rollback also removes the artifact files written inside it.

    Django has no rollback hook, so the files are removed when an exception leaves the block
    (a failure inside it, or a failed commit), each only if no row owns it then: identical text
    committed by another writer meanwhile keeps its file. A block nested in another hands its
    files to the outer one when it succeeds, since the outer one may still roll back. A
    rollback asked for with `transaction.set_rollback` leaves its files to the orphan sweep.
    """
    outer = _files_written.get()
    written: list[ContentAddress] = []
    token = _files_written.set(written)
    try:
        with transaction.atomic():
            yield
    except BaseException:
        _files_written.reset(token)
        _remove_written(written)
        raise
    _files_written.reset(token)
    if outer is not None:
        outer.extend(written)


def _remove_written(written: list[ContentAddress]) -> None:
    for address in written:
        try:
            remove_unowned_file(sha256=address.sha256, storage_key=address.storage_key)
        except Exception:  # noqa: BLE001 - the original failure is what the caller must see
            logger.exception(
                "artifact %s: could not remove a rolled-back write", artifact_id_for(address.sha256)
            )


def store_artifact(*, text: str, kind: str, task_id: int | None) -> Artifact:
    """Store `text` under its content address and return its artifact, created on first sight.

    See `store_artifacts`.
    """
    [artifact] = store_artifacts([ArtifactText(text=text, kind=kind, task_id=task_id)])
    return artifact


def store_artifacts(texts: Sequence[ArtifactText]) -> list[Artifact]:
    """Store each text under its content address; return their artifacts, in order.

    Texts must be valid Unicode (see `storage.content_address`). The task is recorded as the
    producer only when the artifact is new: identical text stored later shares the first row.
    Must run inside the caller's transaction (`atomic_storing_artifacts()`): every row stays
    locked until it ends (every row is locked once inserted or found), so a concurrent prune
    waits for it and then sees the caller's new references. Two queries for the batch (the
    insert, the lock), plus the file writes: `store_artifacts_and_composites` with no
    composites.
    """
    return store_artifacts_and_composites(texts, [])[0]


def store_artifacts_and_composites(
    texts: Sequence[ArtifactText],
    composites: Sequence[tuple[Sequence[Stored], str, int | None]],
) -> tuple[list[Artifact], list[Artifact]]:
    """`store_artifacts(texts)` and `store_composites(composites)` at once, in fewer
    statements: the rows of both inserted together and locked together, then the composites'
    part rows. A composite's part may be one of the texts or another composite of the batch.
    Runs inside the caller's transaction, like `store_artifacts`. Three queries for the batch,
    plus the file writes; a long transcript's dispatch stores its newest piece and the
    composites naming the whole this way."""
    addresses = [item.address() for item in texts]
    wanted = _wanted(texts, addresses)
    rows = {artifact_id: _new_row(item, address) for artifact_id, (item, address) in wanted.items()}
    ordered: list[str] = []
    parts_of: dict[str, Sequence[Stored]] = {}
    for parts, kind, task_id in composites:
        row = composite_row(parts, kind=kind, task_id=task_id)
        ordered.append(row.pk)
        if rows.setdefault(row.pk, row) is row:
            parts_of[row.pk] = parts
    locked: dict[str, Artifact] = {}
    missing = sorted(rows)
    while missing:
        # Inserted now, a row is this transaction's own until it ends; one that existed is
        # locked. One that existed when inserting but is gone when locking was pruned in
        # between: it is inserted again.
        Artifact.objects.bulk_create(
            [rows[artifact_id] for artifact_id in missing], ignore_conflicts=True
        )
        found = _locked(missing)
        locked.update(found)
        missing = [artifact_id for artifact_id in missing if artifact_id not in found]
    # A composite's parts follow from its id (its parts' content in order), so the part rows
    # of one that existed are these same rows, and inserting them again changes nothing.
    ArtifactPart.objects.bulk_create(
        [
            ArtifactPart(composite_id=artifact_id, part_id=part.pk, position=position)
            for artifact_id, parts in parts_of.items()
            for position, part in enumerate(parts)
        ],
        ignore_conflicts=True,
    )
    for artifact_id in ordered:
        if locked[artifact_id].sha256 != rows[artifact_id].sha256:
            raise ArtifactIntegrityError(
                f"artifact id {artifact_id} already names different content (sha256 prefix clash)"
            )
    _write_files(wanted, locked)
    return (
        [locked[artifact_id_for(address.sha256)] for address in addresses],
        [locked[artifact_id] for artifact_id in ordered],
    )


def _wanted(
    texts: Sequence[ArtifactText], addresses: Sequence[ContentAddress]
) -> dict[str, tuple[ArtifactText, ContentAddress]]:
    """Each distinct text to store, by artifact id."""
    wanted: dict[str, tuple[ArtifactText, ContentAddress]] = {}
    for item, address in zip(texts, addresses, strict=True):
        wanted.setdefault(artifact_id_for(address.sha256), (item, address))
    return wanted


def _write_files(
    wanted: dict[str, tuple[ArtifactText, ContentAddress]], artifacts: dict[str, Artifact]
) -> None:
    """Each text's file, once its row is held (checked against the row's sha256 first)."""
    for artifact_id, (item, address) in wanted.items():
        if artifacts[artifact_id].sha256 != address.sha256:
            raise ArtifactIntegrityError(
                f"artifact id {artifact_id} already names different content (sha256 prefix clash)"
            )
        if ensure_stored(text=item.text, address=address):
            written = _files_written.get()
            if written is not None:
                written.append(address)


def composite_sha256(part_sha256s: Sequence[str]) -> str:
    """The sha256 that names a composite of parts with these sha256s, in this order.

    Distinct from the sha256 of any stored text (a prefix no text's digest input has), so a
    composite never shares an id with a text, and two composites with the same parts in the
    same order are one.
    """
    digest = hashlib.sha256(b"baton-composite-v1\n")
    for sha256 in part_sha256s:
        digest.update(sha256.encode("ascii") + b"\n")
    return digest.hexdigest()


class Stored(Protocol):
    """What a composite reads of each of its parts: an artifact row, or plain data standing for
    a stored one (a long transcript lists many, and a model instance each costs more than the
    rest of its handling)."""

    @property
    def pk(self) -> str: ...

    @property
    def sha256(self) -> str: ...

    @property
    def size_bytes(self) -> int: ...

    @property
    def size_chars(self) -> int: ...

    @property
    def size_lines(self) -> int: ...


def composite_row(parts: Sequence[Stored], *, kind: str, task_id: int | None) -> Artifact:
    """The (unsaved) row of the composite of `parts`: `store_composites` stores it. A part may
    itself be a composite stored in the same batch."""
    if not parts:
        raise ValueError("a composite artifact needs at least one part")
    sha256 = composite_sha256([part.sha256 for part in parts])
    return Artifact(
        id=artifact_id_for(sha256),
        sha256=sha256,
        storage_key="",
        composite=True,
        size_chars=sum(part.size_chars for part in parts),
        size_bytes=sum(part.size_bytes for part in parts),
        size_lines=sum(part.size_lines for part in parts),
        kind=kind,
        task_id=task_id,
    )


def store_composites(
    composites: Sequence[tuple[Sequence[Stored], str, int | None]],
) -> list[Artifact]:
    """Store each composite (its parts in order, its kind, its task) once; return their rows.

    A composite's content is its parts' contents in order: nothing is written to storage. Its
    sizes are the sums of its parts' (its lines too: every part but the last must end with a
    newline). A part may be a composite of the same batch (every row is inserted before any
    part is linked). A composite that exists is locked and left as it is: only new ones get
    part rows, so a part list is never rewritten. Runs inside the caller's transaction, like
    `store_artifacts`: `store_artifacts_and_composites` with no texts.
    """
    return store_artifacts_and_composites([], composites)[1]


def restore_artifact_file(*, artifact: Artifact, text: str) -> bool:
    """Write `artifact`'s file again from `text` when it is missing or damaged; True when it
    was written. Text whose sha256 is not the artifact's is never written (False), nor is
    anything for a composite, which has no file of its own (its parts' files are their own
    artifacts'). Must run inside the caller's transaction: the row is locked first, as every
    writer of a file does.
    """
    if artifact.composite:
        return False
    address = content_address(text)
    if address.sha256 != artifact.sha256:
        return False
    if not Artifact.objects.select_for_update().filter(pk=artifact.pk).exists():
        return False
    return ensure_stored(text=text, address=address)


def locked_stored_artifact(*, sha256: str) -> Artifact | None:
    """The artifact of `sha256`, its row locked until the caller's transaction ends, when its
    stored file is whole (checked against the sha256); else None: no such row, or its file is
    missing or damaged, which only the text itself can mend. A composite's sha256 names no
    stored file (it is no text's digest), so it gives None too. Must run inside the caller's
    transaction, like every writer that holds an address."""
    artifact = Artifact.objects.select_for_update().filter(sha256=sha256, composite=False).first()
    if artifact is None:
        return None
    try:
        intact = stored_sha256(artifact_storage(), artifact.storage_key) == sha256
    except FileNotFoundError:
        intact = False
    if not intact:
        logger.warning("artifact %s: stored content missing or damaged", artifact.pk)
        return None
    return artifact


def _new_row(item: ArtifactText, address: ContentAddress) -> Artifact:
    if isinstance(item.text, SpooledText):
        chars, lines = item.text.chars, item.text.lines
    else:
        chars, lines = len(item.text), count_lines(item.text)
    return Artifact(
        id=artifact_id_for(address.sha256),
        sha256=address.sha256,
        storage_key=address.storage_key,
        size_chars=chars,
        size_bytes=address.size_bytes,
        size_lines=lines,
        kind=item.kind,
        task_id=item.task_id,
    )


def _locked(artifact_ids: list[str]) -> dict[str, Artifact]:
    """The rows of these ids, locked in id order (the order every writer locks them in); by id.
    SQLite has no row locks: its IMMEDIATE transactions already hold its write lock (see
    `tasks.services.lock_task`), and the ORM leaves the lock out there."""
    rows = Artifact.objects.filter(id__in=artifact_ids).order_by("id").select_for_update()
    return {row.pk: row for row in rows}
