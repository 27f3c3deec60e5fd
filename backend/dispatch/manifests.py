"""Manifests: the files a claimed turn's workspace must hold for its prompts' pointer lines.

One manifest serves a turn's full prompt and its resume prompt: every file either prompt's
pointer lines name (`.baton/artifacts/<id>.txt`, the transcript at `.baton/history/...`), each
once, then the history files a transcript is split into. Invariant: every pointer leads to a
file the manifest lists.
"""

from __future__ import annotations

from collections.abc import Sequence

from backend.artifacts.models import Artifact
from backend.artifacts.selectors import ManifestEntry, manifest_artifacts
from backend.dispatch.prompts import TurnPrompt
from backend.tasks.transcripts import HistoryFiles


def artifacts_to_list(
    prompts: Sequence[tuple[int, TurnPrompt, TurnPrompt | None]],
    *,
    history_files: dict[int, HistoryFiles],
) -> dict[str, Artifact]:
    """The artifacts the manifests of these prompts (task id, prompt, resume prompt) list, by
    id, in one query: a transcript this dispatch stored comes with its entry, no row to read."""
    return {
        artifact.id: artifact
        for artifact in manifest_artifacts(
            artifact_ids=[
                artifact_id
                for task_id, prompt, resume in prompts
                for artifact_id, path in files_of(prompt, resume)
                if stored_transcript(
                    history_files.get(task_id) if prompt.transcript else None,
                    artifact_id=artifact_id,
                    path=path,
                )
                is None
            ]
        )
    }


def manifest_of(
    *,
    prompt: TurnPrompt,
    resume: TurnPrompt | None,
    artifacts: dict[str, Artifact],
    history: HistoryFiles | None,
) -> list[ManifestEntry]:
    """The files the prompts point to, then the history files. A transcript in parts is
    listed with its parts (its row has no file to download)."""
    return [
        *(
            stored_transcript(history, artifact_id=artifact_id, path=path)
            or ManifestEntry.of(artifacts[artifact_id], workspace_path=path)
            for artifact_id, path in files_of(prompt, resume)
        ),
        *(history.files if history is not None else []),
    ]


def stored_transcript(
    history: HistoryFiles | None, *, artifact_id: str, path: str
) -> ManifestEntry | None:
    """The manifest entry of the transcript in parts this dispatch stored, when it is the file
    this pointer line names."""
    composite = history.transcript if history is not None else None
    if composite is not None and artifact_id == composite.id and path == composite.workspace_path:
        return composite
    return None


def files_of(prompt: TurnPrompt, resume: TurnPrompt | None) -> list[tuple[str, str]]:
    """The (artifact id, workspace path) of every pointer line either prompt shows, each once:
    one manifest serves both (with fewer turns, a resume prompt may keep a turn the full prompt
    dropped)."""
    files: dict[tuple[str, str], None] = {}
    for turn_prompt in (prompt, resume):
        if turn_prompt is None:
            continue
        for section in turn_prompt.build.document.sections:
            pointers = [message.artifact for message in section.messages]
            if section.summary is not None:
                pointers.insert(0, section.summary.artifact)
            if section.notice is not None:
                pointers.insert(0, section.notice.transcript)
            for pointer in pointers:
                if pointer is not None:
                    files[(pointer.artifact_id, pointer.workspace_path)] = None
    return list(files)
