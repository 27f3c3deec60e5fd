"""The Anthropic Messages wire (`POST …/messages`): what Claude Code reads.

Claude Code needs the full event sequence — message_start, content_block_start/delta/stop per
block, message_delta (stop_reason, usage), message_stop — each with its `event:` line; without
those lines it reports "0 stream events received" and retries once with `stream: false`, so the
JSON form is answered too. Tool input streams as `input_json_delta` pieces, as Anthropic sends it.
A reasoning turn becomes a `thinking` block (with a made-up signature) before the text.

Usage: Anthropic's `input_tokens` excludes cache reads, so the scripted (OpenAI-meaning) input
count is split into `input_tokens` and `cache_read_input_tokens`.
"""

from __future__ import annotations

import json
from typing import Any

from executors.standin.errors import error_reply
from executors.standin.script import Turn, TurnUsage
from executors.standin.wire import (
    IdSource,
    JsonReply,
    Reply,
    StreamReply,
    model_name,
    sse,
    text_deltas,
)

API = "messages"
THINKING_SIGNATURE = "standin-signature"
# Tool input arrives in a few pieces so that clients must join partial JSON, as with the real API.
_INPUT_JSON_PIECES = 3


def usage_json(usage: TurnUsage) -> dict[str, Any]:
    return {
        "input_tokens": max(usage.input_tokens - usage.cached_input_tokens, 0),
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": usage.cached_input_tokens,
        "output_tokens": usage.output_tokens,
    }


def _content(turn: Turn, ids: IdSource) -> list[dict[str, Any]]:
    blocks: list[dict[str, Any]] = []
    if turn.reasoning is not None:
        blocks.append(
            {"type": "thinking", "thinking": turn.reasoning, "signature": THINKING_SIGNATURE}
        )
    if turn.text is not None:
        blocks.append({"type": "text", "text": turn.text})
    if turn.call is not None:
        blocks.append(
            {
                "type": "tool_use",
                "id": ids.next("toolu"),
                "name": turn.call.name,
                "input": dict(turn.call.arguments),
            }
        )
    return blocks


def _pieces(text: str, count: int) -> list[str]:
    size = max(-(-len(text) // count), 1)
    return [text[start : start + size] for start in range(0, len(text), size)]


def _block_events(index: int, block: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """content_block_start, its deltas and content_block_stop for one content block."""
    start: dict[str, Any]
    deltas: list[dict[str, Any]]
    if block["type"] == "text":
        start = {"type": "text", "text": ""}
        deltas = [{"type": "text_delta", "text": piece} for piece in text_deltas(block["text"])]
    elif block["type"] == "thinking":
        start = {"type": "thinking", "thinking": "", "signature": ""}
        deltas = [
            {"type": "thinking_delta", "thinking": block["thinking"]},
            {"type": "signature_delta", "signature": block["signature"]},
        ]
    else:
        start = {**block, "input": {}}
        partial = json.dumps(block["input"], ensure_ascii=False)
        deltas = [
            {"type": "input_json_delta", "partial_json": piece}
            for piece in _pieces(partial, _INPUT_JSON_PIECES)
        ]
    events = [("content_block_start", {"index": index, "content_block": start})]
    events.extend(("content_block_delta", {"index": index, "delta": delta}) for delta in deltas)
    events.append(("content_block_stop", {"index": index}))
    return events


def reply(turn: Turn, body: dict[str, Any], ids: IdSource) -> Reply:
    """The answer to one Messages request with ``turn``."""
    if not turn.succeeds:
        return error_reply(API, turn)
    content = _content(turn, ids)
    stop_reason = "tool_use" if turn.call is not None else "end_turn"
    usage = usage_json(turn.usage)
    message: dict[str, Any] = {
        "id": ids.next("msg"),
        "type": "message",
        "role": "assistant",
        "model": model_name(body, "claude-standin"),
        "content": content,
        "stop_reason": stop_reason,
        "stop_sequence": None,
        "usage": usage,
    }
    if body.get("stream") is not True:
        return JsonReply(200, message)

    # message_start reports the input side; the output count arrives with message_delta.
    start_usage = {**usage, "output_tokens": 1}
    started = {**message, "content": [], "stop_reason": None, "usage": start_usage}
    events: list[tuple[str, dict[str, Any]]] = [
        ("message_start", {"message": started}),
        ("ping", {}),
    ]
    for index, block in enumerate(content):
        events.extend(_block_events(index, block))
    events.append(
        (
            "message_delta",
            {
                "delta": {"stop_reason": stop_reason, "stop_sequence": None},
                "usage": {"output_tokens": turn.usage.output_tokens},
            },
        )
    )
    events.append(("message_stop", {}))
    return StreamReply([sse(kind, {"type": kind, **payload}) for kind, payload in events])
