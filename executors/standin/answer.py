"""The stand-in model's answer: what it received, told back to a human in a few labelled lines.

Without a scripted turn the server answers every model call with :func:`standin_answer`, so a
demo without a model provider still shows something true about the prompt Baton built: the
history it carried and the current message it quoted. A person doing the README walkthrough can
see that a follow-up was answered *with* its history. The answer is a pure function of the
prompt text (same prompt, same bytes) and never asks for a tool.

:func:`extract_prompt` finds the prompt in a request body the way each executor sends it: the
last user text of the Responses ``input``, of the Chat ``messages`` or of the Anthropic
``messages``.

The prompt grammar read here is the one Baton renders (``backend.prompting.render``), re-read
with a few lines of its own because this package never imports the backend: header lines that
are exactly ``## Conversation History``, ``## Current Message`` or ``## Previous Result``, and
messages that start with a label line (``User:``, ``User[alice]:``, ``Assistant:``,
``Assistant[bot]:``, optionally followed by `` [failed]``). Escaped content lines start with a
backslash, so they never read as a label here either; a prompt that has any opens with one
``[note: …]`` line, which is skipped. A history may hold a summary block after its notice: its
``[summary of messages …]`` header line is named in the answer.

A summary job's prompt (its Current Message opens with :data:`SUMMARY_REQUEST_OPENING`) gets a
stand-in summary instead: one line per message it was asked to summarize, so ``make run``
shows rolling summaries at work without a model.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

STANDIN_LABEL = "[Baton stand-in model — not a real model]"
QUOTE_MAX_CHARS = 200
# How Baton's summary jobs open their request (backend.prompting.summary), and how many
# messages a stand-in summary lists.
SUMMARY_REQUEST_OPENING = "[Baton summary request]"
SUMMARY_MAX_LINES = 20
SUMMARY_QUOTE_MAX_CHARS = 80

HISTORY = "Conversation History"
CURRENT = "Current Message"
PREVIOUS_RESULT = "Previous Result"
_SECTION_HEADERS = {f"## {title}": title for title in (HISTORY, CURRENT, PREVIOUS_RESULT)}
_LABEL = re.compile(r"(?P<role>User|Assistant)(?:\[(?P<name>[^\[\]\n]+)\])?:(?: \[failed\])?")
_OMISSION_NOTICE = re.compile(r"\[omitted earlier messages: \d+ \(.*\)\]")
_SUMMARY_HEADER = re.compile(r"\[summary of messages \d+ to \d+.*\]")
_ESCAPE_NOTE = re.compile(r"\[note: .*\]")


@dataclass
class _Message:
    label: str
    role: str
    lines: list[str] = field(default_factory=list)


@dataclass
class _Section:
    title: str
    notice: str | None = None
    summary: str | None = None
    """The summary block's header line, without where its transcript is."""
    messages: list[_Message] = field(default_factory=list)


def _sections(prompt: str) -> list[_Section]:
    """The sections of a Baton prompt, or [] when it is a verbatim (unsectioned) prompt."""
    lines = prompt.split("\n")
    if _ESCAPE_NOTE.fullmatch(lines[0]) and lines[1:2] == [""]:
        lines = lines[2:]  # the note a prompt with escaped lines opens with
    if not lines or lines[0] not in _SECTION_HEADERS:
        return []
    sections: list[_Section] = []
    for line in lines:
        title = _SECTION_HEADERS.get(line)
        if title is not None:
            sections.append(_Section(title))
            continue
        section = sections[-1]
        label = _LABEL.fullmatch(line)
        if label is not None:
            section.messages.append(_Message(line, label["role"]))
        elif section.messages:
            section.messages[-1].lines.append(line)
        elif _OMISSION_NOTICE.fullmatch(line):
            section.notice = line
        elif section.notice is not None and _SUMMARY_HEADER.fullmatch(line):
            section.summary = line.split(" · ")[0].removesuffix("]") + "]"
    return sections


def _one_line(text: str) -> str:
    """``text`` on one line (whitespace runs collapsed), cut to QUOTE_MAX_CHARS with an ellipsis."""
    flat = " ".join(text.split())
    if len(flat) <= QUOTE_MAX_CHARS:
        return flat
    return flat[:QUOTE_MAX_CHARS] + "…"


def _quote(message: _Message) -> str:
    content = "\n".join(message.lines)
    return f'"{_one_line(content)}"'


def _plural(count: int, word: str) -> str:
    return f"{count} {word}" if count == 1 else f"{count} {word}s"


def _history_line(section: _Section | None) -> str:
    if section is None:
        return "History: none."
    users = sum(1 for message in section.messages if message.role == "User")
    assistants = len(section.messages) - users
    line = (
        f"History: {_plural(len(section.messages), 'message')} "
        f"({users} user, {assistants} assistant)"
    )
    if section.notice is not None:
        line += f", after {section.notice}"
    if section.summary is not None:
        line += f" and {section.summary}"
    return line + "."


def _message_line(title: str, section: _Section | None) -> str:
    if section is None or not section.messages:
        return f"{title}: none."
    first = section.messages[0]
    line = f"{title} from {first.label} {_quote(first)}"
    if len(section.messages) > 1:
        line += f" (and {_plural(len(section.messages) - 1, 'more message')})"
    return line


def _session_line(earlier_answers: int) -> list[str]:
    if not earlier_answers:
        return []
    return [
        f"The session this continues already holds {_plural(earlier_answers, 'earlier answer')} "
        "(a resumed session: Baton sent only what it had not seen)."
    ]


def standin_answer(prompt: str, *, earlier_answers: int = 0) -> str:
    """The stand-in's deterministic answer to ``prompt``; see the tests for the exact text.

    ``earlier_answers`` counts the assistant messages already in the request's conversation:
    an executor that resumed its own session sends them before the new prompt.
    """
    sections = _sections(prompt)
    if not sections:
        return "\n".join(
            [
                STANDIN_LABEL,
                f"Received a verbatim prompt of {_plural(len(prompt), 'character')}; "
                "no conversation history in it.",
                *_session_line(earlier_answers),
                f'Current message: "{_one_line(prompt)}"',
            ]
        )
    by_title = {section.title: section for section in sections}
    current = by_title.get(CURRENT)
    if current is not None and current.messages:
        request = "\n".join(current.messages[0].lines)
        if request.startswith(SUMMARY_REQUEST_OPENING):
            return _summary_answer(by_title.get(HISTORY))
    lines = [
        STANDIN_LABEL,
        f"Received a Baton prompt of {_plural(len(prompt), 'character')} with sections: "
        + ", ".join(section.title for section in sections)
        + ".",
        _history_line(by_title.get(HISTORY)),
        *_session_line(earlier_answers),
        _message_line("Current message", by_title.get(CURRENT)),
    ]
    if PREVIOUS_RESULT in by_title:
        lines.append(_message_line("Previous result", by_title[PREVIOUS_RESULT]))
    return "\n".join(lines)


def _summary_answer(history: _Section | None) -> str:
    """A stand-in summary: the messages shown, one short line each, after what it folds in."""
    messages = history.messages if history is not None else []
    users = sum(1 for message in messages if message.role == "User")
    opening = (
        f"Stand-in summary of {_plural(len(messages), 'message')} "
        f"({users} user, {len(messages) - users} assistant)"
    )
    if history is not None and history.summary is not None:
        opening += f", folding in {history.summary}"
    lines = [STANDIN_LABEL, opening + "."]
    for message in messages[:SUMMARY_MAX_LINES]:
        flat = " ".join(" ".join(message.lines).split())
        if len(flat) > SUMMARY_QUOTE_MAX_CHARS:
            flat = flat[:SUMMARY_QUOTE_MAX_CHARS] + "…"
        lines.append(f"- {message.label} {flat}")
    if len(messages) > SUMMARY_MAX_LINES:
        lines.append(f"- (and {_plural(len(messages) - SUMMARY_MAX_LINES, 'more message')})")
    return "\n".join(lines)


def _last_text(content: Any, part_types: tuple[str, ...]) -> str | None:
    """A message's text: the content itself when a string, else its last text part."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        return None
    for part in reversed(content):
        if isinstance(part, Mapping) and part.get("type") in part_types:
            text = part.get("text")
            if isinstance(text, str):
                return text
    return None


# Where each API keeps its conversation, and which content parts carry user text.
_CONVERSATION_KEY = {"responses": "input", "chat": "messages", "messages": "messages"}
_TEXT_PART_TYPES = {"responses": ("input_text",), "chat": ("text",), "messages": ("text",)}


def extract_prompt(api: str, body: Mapping[str, Any]) -> str | None:
    """The prompt of a model request: the last user message's last text, or None if it has none.

    ``api`` is ``"responses"`` (OpenAI Responses: Codex, Agno's OpenAIResponses), ``"chat"``
    (Chat Completions: Agno's OpenAIChat) or ``"messages"`` (Anthropic Messages: Claude Code).
    """
    if api not in _CONVERSATION_KEY:
        raise ValueError(f"unknown API {api!r}")
    conversation = body.get(_CONVERSATION_KEY[api])
    if api == "responses" and isinstance(conversation, str):
        return conversation  # the Responses API also takes the input as one string
    if not isinstance(conversation, list):
        return None
    for message in reversed(conversation):
        if isinstance(message, Mapping) and message.get("role") == "user":
            return _last_text(message.get("content"), _TEXT_PART_TYPES[api])
    return None


def earlier_answers(api: str, body: Mapping[str, Any]) -> int:
    """How many assistant messages come before the prompt in a request's conversation."""
    conversation = body.get(_CONVERSATION_KEY[api])
    if not isinstance(conversation, list):
        return 0
    return sum(
        1
        for message in conversation
        if isinstance(message, Mapping) and message.get("role") == "assistant"
    )
