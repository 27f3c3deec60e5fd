"""Ingestion: measure a turn's text once, keep a bounded preview, spill long text to an artifact.

Called whenever a USER message or an ASSISTANT result is recorded. After it, the turn carries
everything prompt building needs (the history text or its head+tail preview, sizes, token
counts, the artifact pointer), so building a prompt never touches the full text again and costs
the same whether a result was 1 KB or 1 GB (docs/architecture.md, principles 1 and 2).

The spill decision and the preview belong to the turns; the artifact itself is only storage
(`backend.artifacts.services.store_artifact`), so the dependency points from tasks to artifacts.

A result value a worker uploads as a stream is stored first (`store_uploaded_text`) and ingested
from storage when the report names it (`ingest_stored_text`), to the same fields `ingest_text`
gives that text, without the text ever being held whole: a text the preview reads whole (at
most `previews.PREVIEW_SCAN_MAX_CHARS`) is read and ingested as a string; a longer one is
measured by its artifact row and previewed from its two ends, which is all its preview reads.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from django.conf import settings

from backend.artifacts.models import Artifact
from backend.artifacts.services import ArtifactText, store_artifact, store_artifacts
from backend.artifacts.storage import SpooledText, artifact_storage, read_text, read_text_ends
from backend.prompting.addressing import count_lines
from backend.prompting.kinds import SAMPLE_CHARS, ArtifactKind, classify_ends, classify_text
from backend.prompting.previews import TextEnds, ends_to_read, make_ends_preview, make_kind_preview
from backend.prompting.truncate import Preview
from backend.prompting.units import O200K_ENCODING, count_tokens
from backend.tasks.models import Task

# Lone surrogates cannot be encoded as UTF-8, and PostgreSQL text cannot hold NUL.
_UNSTORABLE = re.compile("[\x00\ud800-\udfff]")


@dataclass(frozen=True)
class IngestedText:
    """What ingestion stores on a turn (the Subtask history_* fields)."""

    history_text: str
    history_text_tokens: int
    history_text_tokens_o200k: int
    preview_head: str
    preview_tail: str
    preview_layout: dict[str, Any]
    chars: int
    bytes: int
    lines: int
    tokens: int
    tokens_estimated: bool
    replaced_chars: int
    artifact: Artifact | None


def replace_unstorable_chars(text: str) -> tuple[str, int]:
    """Text safe to store and encode, and how many characters became U+FFFD.

    Lone surrogates and NUL become U+FFFD in what the model sees (history text, preview,
    artifact); the turn's stored result keeps them, so nothing is lost.
    """
    if _UNSTORABLE.search(text) is None:
        return text, 0
    return _UNSTORABLE.subn("\ufffd", text)


def ingest_text(*, text: str, task: Task | None, serialized_json: bool = False) -> IngestedText:
    """Measure `text` and, when it is longer than the spill threshold, store it as an artifact.

    `serialized_json` says the text is Baton's canonical JSON of a result without `value`
    (it classifies the artifact as json). Must run inside the transaction that records the
    turn: if anything fails, the turn is not marked recorded and the call can be retried.
    """
    text, replaced = replace_unstorable_chars(text)
    chars = len(text)
    lines = count_lines(text)
    if chars <= settings.BATON_SPILL_THRESHOLD_CHARS:
        tokens = count_tokens(text)
        return IngestedText(
            history_text=text,
            history_text_tokens=tokens,
            history_text_tokens_o200k=count_tokens(text, O200K_ENCODING),
            preview_head="",
            preview_tail="",
            preview_layout={},
            chars=chars,
            bytes=len(text.encode("utf-8")),
            lines=lines,
            tokens=tokens,
            tokens_estimated=False,
            replaced_chars=replaced,
            artifact=None,
        )

    kind = classify_text(text, serialized_json=serialized_json)
    preview = make_kind_preview(
        text,
        kind,
        head_chars=settings.BATON_PREVIEW_HEAD_CHARS,
        tail_chars=settings.BATON_PREVIEW_TAIL_CHARS,
    )
    artifact = store_artifact(text=text, kind=kind, task_id=None if task is None else task.pk)
    return _spilled(preview, artifact=artifact, chars=chars, lines=lines, replaced=replaced)


def store_uploaded_text(*, text: SpooledText, task_id: int) -> Artifact:
    """Store text that arrived as a stream (a result value a worker uploads) as an artifact,
    classified as `ingest_text` classifies it, with the task as its producer when it is new.

    Only the ends the classifier samples are read back from the spool. Must run inside the
    caller's transaction (`atomic_storing_artifacts()`), as `store_artifacts` says.
    """
    [artifact] = store_artifacts(
        [ArtifactText(text=text, kind=_classify_spooled(text), task_id=task_id)]
    )
    return artifact


def _classify_spooled(text: SpooledText) -> ArtifactKind:
    if text.chars <= 2 * SAMPLE_CHARS:
        return classify_text(read_text(text.file))
    head, tail = read_text_ends(text.file, size_bytes=text.address.size_bytes, chars=SAMPLE_CHARS)
    return classify_ends(head, tail)


def ingest_stored_text(*, artifact: Artifact, task: Task) -> IngestedText:
    """What `ingest_text` gives the text stored as `artifact` (valid Unicode without NUL, as an
    upload is), reading no more of it than its preview needs.

    The caller holds the artifact's row locked, its stored file checked whole
    (`artifacts.services.locked_stored_artifact`). A text whose preview reads it whole
    (`previews.ends_to_read`), the ones within the spill threshold included, is read and
    ingested as a string. A longer one spills to this very artifact: its sizes are the row's,
    and its kind and preview come from its two ends, read from storage.
    """
    head_chars = settings.BATON_PREVIEW_HEAD_CHARS
    tail_chars = settings.BATON_PREVIEW_TAIL_CHARS
    each = ends_to_read(artifact.size_chars, head_chars=head_chars, tail_chars=tail_chars)
    if each is None or artifact.size_chars <= settings.BATON_SPILL_THRESHOLD_CHARS:
        with artifact_storage().open(artifact.storage_key, "rb") as stored:
            text = read_text(stored)
        return ingest_text(text=text, task=task)
    with artifact_storage().open(artifact.storage_key, "rb") as stored:
        head, tail = read_text_ends(stored, size_bytes=artifact.size_bytes, chars=each)
    ends = TextEnds(head=head, tail=tail, length=artifact.size_chars)
    kind = classify_ends(ends.head, ends.tail)
    preview = make_ends_preview(ends, kind, head_chars=head_chars, tail_chars=tail_chars)
    return _spilled(
        preview,
        artifact=artifact,
        chars=artifact.size_chars,
        lines=artifact.size_lines,
        replaced=0,
    )


def _spilled(
    preview: Preview, *, artifact: Artifact, chars: int, lines: int, replaced: int
) -> IngestedText:
    """The fields of a text that spilled to `artifact`, with `preview` in its place."""
    kept_tokens = sum(count_tokens(part) for part in preview.parts)
    kept_bytes = sum(len(part.encode("utf-8")) for part in preview.parts)
    middle_bytes = artifact.size_bytes - kept_bytes
    # Estimate the spilled middle at the preview's own bytes-per-token rate (Codex's 4 bytes
    # per token when the preview is empty), instead of tokenizing megabytes.
    middle_tokens = (
        round(middle_bytes * kept_tokens / kept_bytes) if kept_bytes else -(-middle_bytes // 4)
    )
    history_text = preview.text
    return IngestedText(
        history_text=history_text,
        history_text_tokens=count_tokens(history_text),
        history_text_tokens_o200k=count_tokens(history_text, O200K_ENCODING),
        preview_head=preview.head,
        preview_tail=preview.tail,
        preview_layout=preview.layout(),
        chars=chars,
        bytes=artifact.size_bytes,
        lines=lines,
        tokens=kept_tokens + middle_tokens,
        tokens_estimated=True,
        replaced_chars=replaced,
        artifact=artifact,
    )
