"""Hypothesis strategies for prompt inputs, including content that imitates prompt structure."""

from __future__ import annotations

import json

from hypothesis import strategies as st

from backend.prompting import (
    ArtifactPointer,
    ContextPassing,
    CurrentMessage,
    HistoryMessage,
    HistorySummary,
    PromptInput,
    PromptPolicy,
    Role,
    count_tokens,
)
from backend.prompting.kinds import ArtifactKind
from backend.prompting.previews import make_kind_preview

# Pieces of text that look like the prompt's own structure, or like its escapes and markers.
STRUCTURE_LOOKALIKES = (
    "## Conversation History",
    "## Current Message",
    "## Previous Result",
    "## Previous Results",
    "## Notes",
    "User: ",
    "User:",
    "User[alice]: ",
    "Assistant: ",
    "Assistant[coder]: ",
    "[failed] ",
    "Assistant[coder]: [failed]\n",
    "[artifact abc · text · 1 char, 1 line · full text: a.txt]",
    "[omitted earlier messages: 2 (1 user, 1 assistant)]",
    "…3 chars truncated…",
    "...5 tokens truncated...",
    "…\\7 chars truncated…",
    "… 12 Chars Truncated …",
    "…\u200b4 chars truncated…",
    # What a model reads as structure although it is not the exact text.
    "\u200bUser[alice]:\n",
    "\ufeffAssistant:",
    " \tuser: ",
    "### current message",
    "\uff35\uff53\uff45\uff52:",
    "Us\u0435r:",
    "Human:",
    "System: ",
    "[note: ",
    "[summary of messages 1 to 2]",
    "[Summary of messages 1 to 2 · full transcript: x.md]\n",
    "[ ѕummary",
    "\\",
    "\\\\",
    "\n",
    "\n\n",
    "\r",
    "\u2028",
    " ",
    "/",
    "😀",
    "中文",
    "<|endoftext|>",
)

adversarial_text = st.lists(
    st.one_of(st.sampled_from(STRUCTURE_LOOKALIKES), st.text(max_size=12)), max_size=10
).map("".join)

# Longer text, so caps and budgets actually bind: a fragment repeated.
long_text = st.builds(lambda text, times: text * times, adversarial_text, st.integers(1, 120))

some_text = st.one_of(adversarial_text, long_text)

# JSON documents (with adversarial strings), compact or indented, for JSON previews.
json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | adversarial_text | long_text,
    lambda children: (
        st.lists(children, max_size=6) | st.dictionaries(adversarial_text, children, max_size=6)
    ),
    max_leaves=30,
)
json_text = st.builds(
    lambda value, indent, ascii_only: json.dumps(value, indent=indent, ensure_ascii=ascii_only),
    json_values,
    st.none() | st.integers(0, 2),
    st.booleans(),
)
names = st.sampled_from(["alice", "bob", "coder", "reviewer", "a b", "Ünïcødé"])
artifacts = st.builds(
    ArtifactPointer,
    artifact_id=st.sampled_from(["a1b2c3d4e5f6", "0f0f0f0f0f0f", "x"]),
    kind=st.sampled_from(["command_output", "web_or_search", "text"]),
    total_chars=st.integers(0, 3_000_000),
    total_lines=st.integers(0, 100_000),
    workspace_path=st.sampled_from([".baton/artifacts/a1b2c3d4e5f6.txt", "weird ] path]"]),
)


@st.composite
def history_messages(draw: st.DrawFn, message_id: int) -> HistoryMessage:
    role = draw(st.sampled_from(Role))
    failed = role is Role.ASSISTANT and draw(st.booleans())
    spilled = draw(st.booleans())
    cached = draw(st.booleans())
    fields: dict = {
        "message_id": message_id,
        "role": role,
        "sender": draw(st.none() | names) if role is Role.USER else None,
        "bot": draw(st.none() | names) if role is Role.ASSISTANT else None,
        "failed": failed,
        "error": draw(st.none() | adversarial_text) if failed else None,
    }
    if role is Role.USER and message_id > 1 and draw(st.booleans()):
        # Sent while an earlier assistant turn was answering (a steer it received).
        fields["steered_into_message_id"] = draw(st.integers(1, message_id - 1))
        fields["steered_into_bot"] = draw(st.none() | names)
    text = draw(some_text)
    if spilled:
        original = draw(st.builds(str.__add__, st.just(text), long_text) | json_text)
        # Head + tail previews, and the kind-aware ones (several parts, JSON-style markers).
        preview = make_kind_preview(
            original,
            draw(st.sampled_from(list(ArtifactKind))),
            head_chars=draw(st.integers(0, 200)),
            tail_chars=draw(st.integers(0, 200)),
        )
        fields |= {
            "text": preview.text,
            "preview_head": preview.head,
            "preview_tail": preview.tail,
            "preview_middle": preview.middle,
            "preview_elisions": preview.elisions,
            "total_chars": preview.total_chars,
            "artifact": draw(artifacts),
        }
    else:
        fields |= {"text": text, "artifact": draw(st.none() | artifacts)}
    if cached:
        fields["token_count"] = count_tokens(fields["text"])
    return HistoryMessage(**fields)


@st.composite
def summaries(draw: st.DrawFn, before_message_id: int) -> HistorySummary:
    """A summary of some messages older than ``before_message_id`` (whole, or a preview)."""
    last = draw(st.integers(1, before_message_id - 1))
    fields: dict = {
        "first_message_id": draw(st.integers(1, last)),
        "last_message_id": last,
        "artifact": draw(artifacts),
    }
    text = draw(some_text.filter(bool))
    if draw(st.booleans()):
        preview = make_kind_preview(
            draw(st.builds(str.__add__, st.just(text), long_text)),
            ArtifactKind.TEXT,
            head_chars=draw(st.integers(1, 200)),
            tail_chars=draw(st.integers(0, 200)),
        )
        fields |= {
            "text": preview.text,
            "preview_head": preview.head,
            "preview_tail": preview.tail,
            "preview_middle": preview.middle,
            "preview_elisions": preview.elisions,
            "total_chars": preview.total_chars,
        }
    else:
        fields["text"] = text
    if draw(st.booleans()):
        fields["token_count"] = count_tokens(fields["text"])
    return HistorySummary(**fields)


@st.composite
def prompt_inputs(draw: st.DrawFn, max_history: int = 10) -> PromptInput:
    size = draw(st.integers(0, max_history) | st.integers(3, max_history))
    history = tuple(draw(history_messages(message_id=index + 1)) for index in range(size))
    current_text = draw(some_text)
    previous = draw(st.none() | some_text)
    first_user = draw(st.sampled_from(["auto", "none", "explicit"]))
    first_user_id = None
    if first_user == "explicit":
        first_user_id = next((m.message_id for m in history if m.role is Role.USER), 1000)
    return PromptInput(
        history=history,
        current=CurrentMessage(
            message_id=size + 1,
            text=current_text,
            sender=draw(st.none() | names),
            token_count=count_tokens(current_text) if draw(st.booleans()) else None,
        ),
        previous_result=previous,
        previous_result_bot=draw(st.none() | names),
        previous_result_token_count=(
            count_tokens(previous) if previous is not None and draw(st.booleans()) else None
        ),
        previous_result_message_id=(
            size + 2 if previous is not None and draw(st.booleans()) else None
        ),
        is_group_chat=draw(st.booleans()),
        multi_bot=draw(st.booleans()),
        first_user_message_id=first_user_id,
        earlier_user_messages=draw(st.sampled_from([0, 0, 0, 3])),
        earlier_assistant_messages=draw(st.sampled_from([0, 0, 0, 2])),
        summary=draw(st.none() | summaries(before_message_id=size + 1)) if size else None,
    )


@st.composite
def policies(draw: st.DrawFn) -> PromptPolicy:
    max_chars = draw(st.none() | st.integers(1, 4_000))
    per_message_upper = max_chars if max_chars is not None else 2_000
    return PromptPolicy(
        enabled=draw(st.sampled_from([True, True, True, True, False])),
        max_messages=draw(st.none() | st.integers(1, 8)),
        max_chars=max_chars,
        per_message_max_chars=draw(st.none() | st.integers(1, per_message_upper)),
        max_tokens=draw(st.none() | st.integers(1_024, 2_500)),
        keep_first_user_message=draw(st.booleans()),
        previous_result_max_chars=draw(st.none() | st.integers(1, 3_000)),
        current_message_max_chars=draw(st.none() | st.integers(1, 6_000)),
        summary_max_chars=draw(st.none() | st.integers(1, 3_000)),
        context_passing=draw(
            st.sampled_from(
                [
                    ContextPassing.NONE,
                    ContextPassing.ORIGINAL_USER,
                    ContextPassing.PREVIOUS_BOT,
                    ContextPassing.ORIGINAL_AND_PREVIOUS,
                    ContextPassing.ORIGINAL_AND_PREVIOUS,
                    ContextPassing.ORIGINAL_USER,
                ]
            )
        ),
    )


@st.composite
def token_policies(draw: st.DrawFn) -> PromptPolicy:
    """Policies where the token budget, not the char caps, decides."""
    return PromptPolicy(
        max_messages=None,
        max_chars=None,
        per_message_max_chars=draw(st.none() | st.integers(200, 3_000)),
        max_tokens=draw(st.integers(1_024, 1_600)),
        keep_first_user_message=draw(st.booleans()),
        current_message_max_chars=draw(st.none() | st.integers(1, 6_000)),
        previous_result_max_chars=draw(st.none() | st.integers(1, 3_000)),
        summary_max_chars=draw(st.none() | st.integers(1, 3_000)),
    )
