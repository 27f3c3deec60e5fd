"""The OpenAI Chat Completions wire (`POST …/chat/completions`): what Agno's OpenAIChat reads.

A tool call streams as one chunk whose `delta.tool_calls[0]` carries index, id, type, name and
the whole arguments, then a `finish_reason: "tool_calls"` chunk — the form the `openai` SDK and
Agno accumulate. With `stream_options.include_usage` a usage chunk (empty `choices`) comes just
before `data: [DONE]`, and every other chunk has `"usage": null`, as OpenAI sends them. Reasoning
has no Chat Completions form here and is left out; a freeform (custom) tool is sent as a function
whose arguments are `{"input": ...}`.
"""

from __future__ import annotations

import json
import time
from typing import Any

from executors.standin.errors import error_reply
from executors.standin.script import Turn, TurnUsage
from executors.standin.wire import (
    IdSource,
    JsonReply,
    Reply,
    SseEvent,
    StreamReply,
    model_name,
    text_deltas,
)

API = "chat"


def usage_json(usage: TurnUsage) -> dict[str, Any]:
    return {
        "prompt_tokens": usage.input_tokens,
        "completion_tokens": usage.output_tokens,
        "total_tokens": usage.total_tokens,
        "prompt_tokens_details": {"cached_tokens": usage.cached_input_tokens},
        "completion_tokens_details": {"reasoning_tokens": usage.reasoning_tokens},
    }


def _tool_call(turn: Turn, call_id: str) -> dict[str, Any] | None:
    if turn.call is None:
        return None
    return {
        "id": call_id,
        "type": "function",
        "function": {"name": turn.call.name, "arguments": turn.call.arguments_json()},
    }


def _finish_reason(turn: Turn) -> str:
    return "tool_calls" if turn.call is not None else "stop"


def reply(turn: Turn, body: dict[str, Any], ids: IdSource) -> Reply:
    """The answer to one Chat Completions request with ``turn``."""
    if not turn.succeeds:
        return error_reply(API, turn)
    completion_id = ids.next("chatcmpl")
    created = int(time.time())
    model = model_name(body, "standin")
    tool_call = _tool_call(turn, ids.next("call"))

    if body.get("stream") is not True:
        message: dict[str, Any] = {"role": "assistant", "content": turn.text, "refusal": None}
        if tool_call is not None:
            message["tool_calls"] = [tool_call]
        choice = {
            "index": 0,
            "message": message,
            "finish_reason": _finish_reason(turn),
            "logprobs": None,
        }
        return JsonReply(
            200,
            {
                "id": completion_id,
                "object": "chat.completion",
                "created": created,
                "model": model,
                "choices": [choice],
                "usage": usage_json(turn.usage),
                "system_fingerprint": None,
            },
        )

    stream_options = body.get("stream_options")
    include_usage = isinstance(stream_options, dict) and stream_options.get("include_usage") is True

    def chunk(choices: list[dict[str, Any]], usage: dict[str, Any] | None = None) -> SseEvent:
        payload: dict[str, Any] = {
            "id": completion_id,
            "object": "chat.completion.chunk",
            "created": created,
            "model": model,
            "system_fingerprint": None,
            "choices": choices,
        }
        if include_usage:
            payload["usage"] = usage
        return SseEvent(json.dumps(payload, ensure_ascii=False))

    def delta(content: dict[str, Any], finish_reason: str | None = None) -> SseEvent:
        return chunk(
            [{"index": 0, "delta": content, "logprobs": None, "finish_reason": finish_reason}]
        )

    events = [delta({"role": "assistant", "content": "", "refusal": None})]
    events.extend(delta({"content": piece}) for piece in text_deltas(turn.text or ""))
    if tool_call is not None:
        events.append(delta({"tool_calls": [{"index": 0, **tool_call}]}))
    events.append(delta({}, _finish_reason(turn)))
    if include_usage:
        events.append(chunk([], usage_json(turn.usage)))
    events.append(SseEvent("[DONE]"))
    return StreamReply(events)
