"""Content addresses: the artifact id, workspace path and pointer that a text's content implies.

An artifact's id is the first 16 hex digits of the sha256 of its UTF-8 text, and an executor finds
it at ``.baton/artifacts/<id>.txt`` in its workspace (docs/architecture.md, principle 5). Because
the address follows from the content alone, the builder can point to the whole text of anything
it cuts — a history message under the spill threshold, a Current Message or a Previous Result —
before that text is stored: dispatch stores it (``backend.tasks.whole_texts``) before the prompt
leaves, and a preview shows the very pointer the dispatch will send.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

from backend.prompting.inputs import ArtifactPointer
from backend.prompting.kinds import classify_text

ARTIFACT_ID_LENGTH = 16
_ENCODE_CHUNK_CHARS = 1 << 20


def content_sha256(text: str) -> str:
    """The hex sha256 of ``text`` encoded as UTF-8 (in chunks: no second copy of a long text)."""
    digest = hashlib.sha256()
    for start in range(0, len(text), _ENCODE_CHUNK_CHARS):
        digest.update(text[start : start + _ENCODE_CHUNK_CHARS].encode("utf-8", "surrogatepass"))
    return digest.hexdigest()


def artifact_id_for(sha256: str) -> str:
    return sha256[:ARTIFACT_ID_LENGTH]


def workspace_path(artifact_id: str) -> str:
    """Where an executor finds an artifact's whole text inside its workspace."""
    return f".baton/artifacts/{artifact_id}.txt"


def count_lines(text: str) -> int:
    """Lines as Baton counts them everywhere: split on "\\n"; a last line without one counts."""
    if not text:
        return 0
    return text.count("\n") + (0 if text.endswith("\n") else 1)


def content_pointer(text: str) -> ArtifactPointer:
    """The pointer to ``text`` stored as an artifact: the same line dispatch will make true."""
    artifact_id = artifact_id_for(content_sha256(text))
    return ArtifactPointer(
        artifact_id=artifact_id,
        kind=classify_text(text),
        total_chars=len(text),
        total_lines=count_lines(text),
        workspace_path=workspace_path(artifact_id),
    )


@dataclass(frozen=True, slots=True)
class WholeText:
    """A text the prompt cut and points to by its content address, with the turn it came from.

    Dispatch stores it as that artifact (when not stored yet) before the prompt is sent.
    """

    message_id: int
    pointer: ArtifactPointer
    text: str


def pointer_to_whole(
    text: str, message_id: int | None, stored: ArtifactPointer | None
) -> tuple[ArtifactPointer | None, WholeText | None]:
    """The pointer a cut of ``text`` shows: the stored artifact's, else the content address
    (with the whole text to store). None when the text has no turn to keep it."""
    if stored is not None:
        return stored, None
    if message_id is None:
        return None, None
    pointer = content_pointer(text)
    return pointer, WholeText(message_id=message_id, pointer=pointer, text=text)
