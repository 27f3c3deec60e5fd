"""Parsing: strict on shape, exact on content."""

from __future__ import annotations

import pytest

from backend.prompting import (
    OmissionNotice,
    PromptParseError,
    RenderedMessage,
    Role,
    Section,
    SteerNote,
    parse_prompt,
)


def test_parses_notice_only_history() -> None:
    text = (
        "## Conversation History\n\n[omitted earlier messages: 4 (2 user, 2 assistant)]\n\n"
        "## Current Message\n\nUser:\ngo\n"
    )
    parsed = parse_prompt(text)
    history = parsed.section(Section.HISTORY)
    assert history is not None
    assert history.messages == () and history.notice == OmissionNotice(4, 2, 2)
    current = parsed.section(Section.CURRENT)
    assert current is not None and current.messages == (RenderedMessage(Role.USER, None, "go"),)


def test_content_keeps_its_own_blank_lines_and_trailing_newlines() -> None:
    text = "## Current Message\n\nUser:\na\n\n\nb\n\n\n"
    [section] = parse_prompt(text).sections
    assert section.messages[0].content == "a\n\n\nb\n\n"


def test_empty_content_and_failed_without_error() -> None:
    text = "## Previous Result\n\nAssistant[x]: [failed]\n\n"
    [section] = parse_prompt(text).sections
    assert section.messages == (RenderedMessage(Role.ASSISTANT, "x", "", failed=True),)


def test_a_steered_message_keeps_its_note() -> None:
    text = (
        "## Conversation History\n\nUser[bob]: [sent while Assistant[coder] was answering]\n"
        "also test\n\nUser: [sent while Assistant was answering]\nand lint\n\n"
        "## Current Message\n\nUser:\ngo\n"
    )
    history = parse_prompt(text).section(Section.HISTORY)
    assert history is not None
    assert history.messages == (
        RenderedMessage(Role.USER, "bob", "also test", steered_into=SteerNote("coder")),
        RenderedMessage(Role.USER, None, "and lint", steered_into=SteerNote()),
    )


def test_a_text_without_leading_header_is_verbatim() -> None:
    parsed = parse_prompt("User:\nhello\n## Current Message\n")
    assert parsed.verbatim
    assert parsed.sections[0].messages[0].content == "User:\nhello\n## Current Message\n"


@pytest.mark.parametrize(
    "text",
    [
        "## Current Message\n\nUser:\na",  # no final newline
        "## Current Message\nUser:\na\n",  # no blank line after the header
        "## Current Message\n\n",  # empty section
        "## Current Message\n\nUser:\na\n\n## Conversation History\n\nUser:\nb\n",  # order
        "## Current Message\n\nsome text\n",  # content outside a message
        "## Current Message\n\n[omitted earlier messages: 1 (1 user, 0 assistant)]\n\nUser:\na\n",
        "## Current Message\n\nUser: [failed]\nx\n",  # users do not fail
        # Only user messages are steered into a running turn.
        "## Current Message\n\nAssistant: [sent while Assistant was answering]\nx\n",
    ],
)
def test_malformed_prompts_are_rejected(text: str) -> None:
    with pytest.raises(PromptParseError):
        parse_prompt(text)
