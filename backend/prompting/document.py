"""The structure of a prompt: sections, messages and the omission notice, before rendering.

The builder decides *what* goes into a prompt as a :class:`PromptDocument`; ``render`` turns it
into text and ``parse`` turns text back into the same document. Keeping the structure as plain
data is what lets the round trip be tested: ``parse_prompt(render_document(doc)) == doc``.

A message's ``content`` is what the model sees after truncation (markers included) and before
escaping; ``name`` is the bracketed part of its label (a group-chat sender, or a bot when the
task has several), and ``artifact`` the pointer line that ends it, if any.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum

from backend.prompting.inputs import ArtifactPointer, Role


class Section(StrEnum):
    """The three sections, in the order they appear."""

    HISTORY = "Conversation History"
    CURRENT = "Current Message"
    PREVIOUS_RESULT = "Previous Result"

    @property
    def header(self) -> str:
        return f"## {self.value}"


@dataclass(frozen=True, slots=True)
class OmissionNotice:
    """How many older history messages were dropped, by role, and where the whole
    conversation is (a transcript file in the executor's workspace, and one file per turn),
    when there is one."""

    omitted: int
    user: int
    assistant: int
    transcript: ArtifactPointer | None = None


@dataclass(frozen=True, slots=True)
class RenderedMessage:
    """One message as the model sees it (content after truncation, before escaping)."""

    role: Role
    name: str | None
    content: str
    failed: bool = False
    artifact: ArtifactPointer | None = None
    markers: tuple[tuple[int, int], ...] = field(default=(), compare=False)
    """The spans in ``content`` of the markers of real cuts: escaping leaves them alone, while
    any text that only looks like a marker is escaped. (Not compared: a quoted half-marker right
    before the real one can swallow its ellipsis, and the parser then finds no span to give.)"""


@dataclass(frozen=True, slots=True)
class RenderedSection:
    section: Section
    messages: tuple[RenderedMessage, ...] = ()
    notice: OmissionNotice | None = None


@dataclass(frozen=True, slots=True)
class PromptDocument:
    """A whole prompt. ``verbatim`` prompts are one user message's text with no headers.

    ``escape_note``: the prompt opens with the note that says how escaped lines look; it does
    whenever a message's content had a line escaped.
    """

    sections: tuple[RenderedSection, ...]
    verbatim: bool = False
    escape_note: bool = False

    def section(self, section: Section) -> RenderedSection | None:
        return next((s for s in self.sections if s.section is section), None)


ParsedPrompt = PromptDocument
"""What :func:`parse_prompt` returns: the same structure the builder rendered."""
