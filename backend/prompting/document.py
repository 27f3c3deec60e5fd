"""The structure of a prompt: sections, messages, the omission notice and the summary block.

The builder decides *what* goes into a prompt as a :class:`PromptDocument`; ``render`` turns it
into text and ``parse`` turns text back into the same document. Keeping the structure as plain
data is what lets the round trip be tested: ``parse_prompt(render_document(doc)) == doc``.

A message's ``content`` is what the model sees after truncation (markers included) and before
escaping; ``name`` is the bracketed part of its label (a group-chat sender, or a bot when the
task has several), ``steered_into`` the note on a user message's label line when it was sent
while an assistant turn was answering (a steer), and ``artifact`` the pointer line that ends
it, if any. A history section
that omits messages may carry a :class:`SummaryBlock` after its notice: a summary of earlier
messages, shaped like a message whose label line says what it covers.
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
class SteerNote:
    """A user message was sent while an assistant turn was answering, and given to it (a
    steer): its label line says so. ``bot`` names that turn as its own label would (None:
    ``Assistant`` alone, as in a task with one bot, or when the turn is not known)."""

    bot: str | None = None


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
    steered_into: SteerNote | None = None
    """Only on a user message: the assistant turn it was sent to while that turn answered."""


@dataclass(frozen=True, slots=True)
class SummaryBlock:
    """A summary of the messages ``first_message_id`` to ``last_message_id``, as the model
    sees it (content after any cut, before escaping).

    ``transcript_path`` is where the whole conversation is (the notice's transcript), when
    there is one; ``artifact`` the pointer line to the whole summary, when it was cut.
    """

    first_message_id: int
    last_message_id: int
    content: str
    transcript_path: str | None = None
    artifact: ArtifactPointer | None = None
    markers: tuple[tuple[int, int], ...] = field(default=(), compare=False)
    """The spans in ``content`` of the markers of real cuts (see ``RenderedMessage``)."""


@dataclass(frozen=True, slots=True)
class RenderedSection:
    section: Section
    messages: tuple[RenderedMessage, ...] = ()
    notice: OmissionNotice | None = None
    summary: SummaryBlock | None = None
    """Only in the history, only after a notice."""


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
