"""The OpenAI Responses wire (`POST …/responses`): what Codex CLI and Agno's OpenAIResponses read.

Codex CLI 0.163 builds its turn from `response.output_item.done` items and fails the turn unless
`response.completed` (with `response.id`) arrives, so a successful stream always ends with it. The
rest of the sequence mirrors what OpenAI sends (created, item added, content part, text deltas)
so that stricter clients such as the `openai` SDK's stream accumulator work too.

Failures inside a stream are in-band, as OpenAI sends them: `response.failed` with an error code.
Codex 0.163 maps code `context_length_exceeded` there to its "ran out of room in the model's
context window" error, while an HTTP 400 with the same body only reaches the user as raw JSON —
so a scripted context overflow on a stream is sent in-band.
"""

from __future__ import annotations

import time
from typing import Any

from executors.standin.errors import context_overflow_error, error_reply
from executors.standin.script import ToolCall, Turn, TurnUsage
from executors.standin.wire import (
    IdSource,
    JsonReply,
    Reply,
    SseEvent,
    StreamReply,
    model_name,
    sse,
    text_deltas,
)

API = "responses"


def usage_json(usage: TurnUsage) -> dict[str, Any]:
    return {
        "input_tokens": usage.input_tokens,
        "input_tokens_details": {"cached_tokens": usage.cached_input_tokens},
        "output_tokens": usage.output_tokens,
        "output_tokens_details": {"reasoning_tokens": usage.reasoning_tokens},
        "total_tokens": usage.total_tokens,
    }


def _response(
    response_id: str,
    body: dict[str, Any],
    *,
    status: str,
    output: list[dict[str, Any]],
    usage: TurnUsage | None = None,
    error: dict[str, Any] | None = None,
) -> dict[str, Any]:
    return {
        "id": response_id,
        "object": "response",
        "created_at": int(time.time()),
        "status": status,
        "model": model_name(body, "standin"),
        "output": output,
        "usage": usage_json(usage) if usage is not None else None,
        "error": error,
        "incomplete_details": None,
        "instructions": body.get("instructions"),
        "parallel_tool_calls": body.get("parallel_tool_calls", True),
        "tool_choice": body.get("tool_choice", "auto"),
        "tools": body.get("tools", []),
        "metadata": {},
        "store": body.get("store", False),
        "text": {"format": {"type": "text"}},
    }


def _reasoning_item(item_id: str, summary: str) -> dict[str, Any]:
    return {
        "id": item_id,
        "type": "reasoning",
        "summary": [{"type": "summary_text", "text": summary}],
        "content": None,
        "encrypted_content": None,
        "status": "completed",
    }


def _message_item(item_id: str, text: str, *, status: str = "completed") -> dict[str, Any]:
    content = [{"type": "output_text", "text": text, "annotations": []}] if text else []
    return {
        "id": item_id,
        "type": "message",
        "role": "assistant",
        "status": status,
        "content": content,
    }


def _call_item(item_id: str, call_id: str, call: ToolCall) -> dict[str, Any]:
    if call.freeform_input is not None:
        return {
            "id": item_id,
            "type": "custom_tool_call",
            "status": "completed",
            "call_id": call_id,
            "name": call.name,
            "input": call.freeform_input,
        }
    return {
        "id": item_id,
        "type": "function_call",
        "status": "completed",
        "call_id": call_id,
        "name": call.name,
        "arguments": call.arguments_json(),
    }


def _output(turn: Turn, ids: IdSource) -> list[dict[str, Any]]:
    """The response's output items in order: reasoning, message, call."""
    items: list[dict[str, Any]] = []
    if turn.reasoning is not None:
        items.append(_reasoning_item(ids.next("rs"), turn.reasoning))
    if turn.text is not None:
        items.append(_message_item(ids.next("msg"), turn.text))
    if turn.call is not None:
        prefix = "ctc" if turn.call.freeform else "fc"
        items.append(_call_item(ids.next(prefix), ids.next("call"), turn.call))
    return items


def _item_events(index: int, item: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """The events that stream one output item: added, its content deltas, done."""
    item_id = item["id"]
    where = {"item_id": item_id, "output_index": index}
    events: list[tuple[str, dict[str, Any]]] = []
    if item["type"] == "message":
        events.append(
            (
                "response.output_item.added",
                {"item": _message_item(item_id, "", status="in_progress")},
            )
        )
        text = item["content"][0]["text"] if item["content"] else ""
        part = {"type": "output_text", "text": "", "annotations": []}
        events.append(("response.content_part.added", {**where, "content_index": 0, "part": part}))
        for delta in text_deltas(text):
            events.append(
                ("response.output_text.delta", {**where, "content_index": 0, "delta": delta})
            )
        events.append(("response.output_text.done", {**where, "content_index": 0, "text": text}))
        done_part = {**part, "text": text}
        events.append(
            ("response.content_part.done", {**where, "content_index": 0, "part": done_part})
        )
    elif item["type"] == "reasoning":
        summary = item["summary"][0]["text"]
        events.append(
            (
                "response.output_item.added",
                {"item": {**item, "summary": [], "status": "in_progress"}},
            )
        )
        part = {"type": "summary_text", "text": ""}
        at = {**where, "summary_index": 0}
        events.append(("response.reasoning_summary_part.added", {**at, "part": part}))
        events.append(("response.reasoning_summary_text.delta", {**at, "delta": summary}))
        events.append(("response.reasoning_summary_text.done", {**at, "text": summary}))
        events.append(
            ("response.reasoning_summary_part.done", {**at, "part": {**part, "text": summary}})
        )
    elif item["type"] == "function_call":
        started = {**item, "arguments": "", "status": "in_progress"}
        events.append(("response.output_item.added", {"item": started}))
        events.append(
            ("response.function_call_arguments.delta", {**where, "delta": item["arguments"]})
        )
        events.append(
            ("response.function_call_arguments.done", {**where, "arguments": item["arguments"]})
        )
    else:  # custom_tool_call
        started = {**item, "input": "", "status": "in_progress"}
        events.append(("response.output_item.added", {"item": started}))
        events.append(("response.custom_tool_call_input.delta", {**where, "delta": item["input"]}))
        events.append(("response.custom_tool_call_input.done", {**where, "input": item["input"]}))
    events.append(("response.output_item.done", {"item": item}))
    for _, payload in events:
        payload.setdefault("output_index", index)
    return events


def _numbered(events: list[tuple[str, dict[str, Any]]]) -> list[SseEvent]:
    return [
        sse(kind, {"type": kind, "sequence_number": number, **payload})
        for number, (kind, payload) in enumerate(events)
    ]


def _failed_stream(response_id: str, body: dict[str, Any], code: str, message: str) -> Reply:
    """A stream that fails in-band, the way OpenAI reports a broken or refused response."""
    failed = _response(
        response_id, body, status="failed", output=[], error={"code": code, "message": message}
    )
    started = {**failed, "status": "in_progress", "error": None}
    return StreamReply(
        _numbered(
            [("response.created", {"response": started}), ("response.failed", {"response": failed})]
        )
    )


def reply(turn: Turn, body: dict[str, Any], ids: IdSource) -> Reply:
    """The answer to one Responses request with ``turn``.

    A `fail` turn and a context overflow arrive in the stream as `response.failed` (a context
    overflow with code `context_length_exceeded`, which Codex turns into its "ran out of room"
    message); without streaming they are HTTP errors.
    """
    stream = body.get("stream") is True
    if not turn.succeeds and not (stream and (turn.fail is not None or turn.context_overflow)):
        return error_reply(API, turn)
    response_id = ids.next("resp")
    if turn.context_overflow:
        overflow = context_overflow_error(API)
        return _failed_stream(response_id, body, overflow.code or "", overflow.message)
    if turn.fail is not None:
        return _failed_stream(response_id, body, turn.fail_code or "server_error", turn.fail)

    output = _output(turn, ids)
    completed = _response(response_id, body, status="completed", output=output, usage=turn.usage)
    if not stream:
        return JsonReply(200, completed)
    started = {**completed, "status": "in_progress", "output": [], "usage": None}
    events: list[tuple[str, dict[str, Any]]] = [
        ("response.created", {"response": started}),
        ("response.in_progress", {"response": started}),
    ]
    for index, item in enumerate(output):
        events.extend(_item_events(index, item))
    events.append(("response.completed", {"response": completed}))
    return StreamReply(_numbered(events))
