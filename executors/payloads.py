"""What Baton's executor API answers a worker, parsed: a dispatch's turns, their bot and artifacts.

Lenient by design: a newer backend may add fields, and a worker must not break on them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

from pydantic import BaseModel, ConfigDict


class _Payload(BaseModel):
    # Newer backends may add fields; a worker must not break on them.
    model_config = ConfigDict(extra="ignore", frozen=True)


class BotConfigPayload(_Payload):
    bot: str
    executor: str
    model: str = ""
    instructions: str = ""
    permission_mode: str = "full_access"
    max_turns: int | None = None
    timeout_seconds: int = 1800
    context_window: int | None = None
    context_passing: str = ""
    pipeline_step: int = 0
    pipeline_length: int = 1


class ArtifactPartRef(_Payload):
    """One artifact a worker fetches by itself: a part of a composite file, or an artifact
    list (manifest version 2)."""

    id: str
    sha256: str
    size_bytes: int
    download_url: str


class ArtifactEntry(_Payload):
    id: str
    sha256: str
    kind: str
    size_bytes: int
    size_chars: int
    size_lines: int
    path: str
    download_url: str
    # A composite file (manifest version 2): the file at `path` is these parts' bytes, in
    # order; `sha256` then names the composite, not the file's bytes, and `size_bytes` is
    # the parts' total.
    parts: list[ArtifactPartRef] | None = None


class ListedArtifact(_Payload):
    """One file of an artifact list: a manifest entry whose download URL the dispatch's
    `artifact_url_template` gives."""

    id: str
    sha256: str
    kind: str
    size_bytes: int
    size_chars: int
    size_lines: int
    path: str

    def entry(self, *, artifact_url_template: str) -> ArtifactEntry:
        # Quoted: whatever the id holds, the URL names that one artifact.
        download_url = artifact_url_template.replace("{id}", quote(self.id, safe=""))
        return ArtifactEntry(**self.model_dump(), download_url=download_url)


class ArtifactList(_Payload):
    """The document an artifact list holds (UTF-8 JSON): more files of the manifest."""

    files: list[ListedArtifact]


class NativeSessionPayload(_Payload):
    id: str
    worker_id: str
    seen_through_message_id: int


class DispatchedTurn(_Payload):
    task_id: int
    subtask_id: int
    # "turn", or "summary": a job whose answer is a rolling summary of earlier messages. The
    # worker runs and reports both alike.
    kind: str = "turn"
    message_id: int
    attempt: int
    task_type: str
    executor: str
    bot: str
    bot_config: BotConfigPayload
    prompt: str
    prompt_report: dict[str, Any] = {}
    # 1: every manifest file is a plain artifact. 2: `parts` and `artifact_lists` may be used.
    manifest_version: int = 1
    artifacts: list[ArtifactEntry] = []
    # More manifest entries, in JSON documents the worker fetches (`ArtifactList`).
    artifact_lists: list[ArtifactPartRef] = []
    # Any artifact's download URL, with `{id}` in place of its id ("" when unused).
    artifact_url_template: str = ""
    native_session_id: str = ""
    # Offered when this worker holds the bot's native session: resume it with resume_prompt.
    native_session: NativeSessionPayload | None = None
    resume_prompt: str | None = None
    resume_reason: str = ""
    heartbeat_interval_seconds: int = 60


class Dispatch(_Payload):
    turns: list[DispatchedTurn]
    next_ready_in_seconds: float | None = None


@dataclass(frozen=True)
class ProgressOutcome:
    """What Baton did with the progress a heartbeat carried for one claim."""

    stored: bool
    # The length of the partial text Baton holds, when it says (stored, or a mismatch).
    partial_text_chars: int | None
    code: str | None  # why not stored: partial_text_mismatch, lease_lost, cancelled, ...


@dataclass(frozen=True)
class ClaimState:
    subtask_id: int
    attempt: int
    state: str  # running, cancelled, lease_lost, finished
    progress: ProgressOutcome | None = None  # when the heartbeat carried progress
    # Follow-ups for the running agent (strategy steer): (steer_id, message), oldest first.
    steers: tuple[tuple[int, str], ...] = ()
