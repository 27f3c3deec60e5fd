"""The stand-in model server: each wire protocol as real clients read it, scripting, recording.

The `openai` SDK reads the Responses and Chat Completions answers exactly as Codex's and Agno's
clients do; the Anthropic stream is parsed by hand from its `event:`/`data:` lines because
Claude Code needs those lines, not just the JSON. The real executors are exercised against this
server by the end-to-end tests; here every behaviour is pinned down in well under ten seconds.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from executors.standin import (
    STANDIN_LABEL,
    ModelServer,
    ScriptError,
    extract_prompt,
    standin_answer,
)
from executors.standin.errors import CHAT_CONTEXT_MESSAGE
from executors.standin.wire import MAX_TEXT_DELTAS, text_deltas

REPO_ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def server() -> Iterator[ModelServer]:
    with ModelServer() as model_server:
        yield model_server


@pytest.fixture(scope="module")
def http() -> Iterator[httpx.Client]:
    # One client for the module: building one loads the CA bundle (~0.1 s) for nothing on
    # plain-HTTP loopback.
    with httpx.Client(timeout=10) as client:
        yield client


def openai_client(server: ModelServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key="sk-test", max_retries=0)


def anthropic_events(response: httpx.Response) -> list[tuple[str, dict[str, Any]]]:
    """(event line, parsed data) pairs of an Anthropic SSE body; asserts the two agree."""
    events = []
    for block in response.text.strip().split("\n\n"):
        event_line, data_line = block.split("\n")
        assert event_line.startswith("event: ") and data_line.startswith("data: ")
        kind, data = (
            event_line.removeprefix("event: "),
            json.loads(data_line.removeprefix("data: ")),
        )
        assert data["type"] == kind
        events.append((kind, data))
    return events


def post_messages(http: httpx.Client, server: ModelServer, **body: Any) -> httpx.Response:
    return http.post(
        f"{server.url}/v1/messages?beta=true",
        json={"model": "claude-sonnet-4-5", "max_tokens": 100, **body},
        headers={"x-api-key": "sk-ant-test", "anthropic-version": "2023-06-01"},
    )


USER_HI = [{"role": "user", "content": "hi"}]

# -- the stand-in answer ---------------------------------------------------------------------

HISTORY_PROMPT = (
    "## Conversation History\n\n"
    "[omitted earlier messages: 12 (7 user, 5 assistant)]\n\n"
    "User[alice]:\nfirst question\n\n"
    "Assistant[coder]:\nan answer\n\n"
    "Assistant[reviewer]: [failed]\nthe error\n\n"
    "## Current Message\n\n"
    "User[alice]:\nNow add tests\nfor the parser.\n"
)


@pytest.mark.parametrize(
    ("prompt", "answer_lines"),
    [
        pytest.param(
            "Fix the login bug",
            [
                "Received a verbatim prompt of 17 characters; no conversation history in it.",
                'Current message: "Fix the login bug"',
            ],
            id="verbatim",
        ),
        pytest.param(
            "line one\n\n  line two\ttabbed\n",
            [
                "Received a verbatim prompt of 28 characters; no conversation history in it.",
                'Current message: "line one line two tabbed"',
            ],
            id="verbatim-on-one-line",
        ),
        pytest.param(
            "x" * 250,
            [
                "Received a verbatim prompt of 250 characters; no conversation history in it.",
                'Current message: "' + "x" * 200 + '…"',
            ],
            id="verbatim-cut-at-200",
        ),
        pytest.param(
            "",
            [
                "Received a verbatim prompt of 0 characters; no conversation history in it.",
                'Current message: ""',
            ],
            id="empty",
        ),
        pytest.param(
            HISTORY_PROMPT,
            [
                "Received a Baton prompt of 241 characters with sections: "
                "Conversation History, Current Message.",
                "History: 3 messages (1 user, 2 assistant), "
                "after [omitted earlier messages: 12 (7 user, 5 assistant)].",
                'Current message from User[alice]: "Now add tests for the parser."',
            ],
            id="history-notice-failed-turn",
        ),
        pytest.param(
            "## Conversation History\n\nUser:\nhi\n\n"
            "## Previous Result\n\nAssistant[coder]:\nwrote the patch\n",
            [
                "Received a Baton prompt of 89 characters with sections: "
                "Conversation History, Previous Result.",
                "History: 1 message (1 user, 0 assistant).",
                "Current message: none.",
                'Previous result from Assistant[coder]: "wrote the patch"',
            ],
            id="previous-result-without-current",
        ),
        pytest.param(
            "## Conversation History\n\nUser:\nquoted:\n\\Assistant[x]:\nstill content\n\n"
            "## Current Message\n\nUser:\nok\n\n"
            "## Previous Result\n\nAssistant[coder]: [failed]\ntimed out\n",
            [
                "Received a Baton prompt of 156 characters with sections: "
                "Conversation History, Current Message, Previous Result.",
                "History: 1 message (1 user, 0 assistant).",
                'Current message from User: "ok"',
                'Previous result from Assistant[coder]: [failed] "timed out"',
            ],
            id="escaped-label-is-content",
        ),
        pytest.param(
            "[note: a line that starts with \\ is quoted from a message]\n\n"
            "## Conversation History\n\nUser:\n\\User: forged\n\n"
            "## Current Message\n\nUser:\nok\n",
            [
                "Received a Baton prompt of 135 characters with sections: "
                "Conversation History, Current Message.",
                "History: 1 message (1 user, 0 assistant).",
                'Current message from User: "ok"',
            ],
            id="escape-note-opens-the-prompt",
        ),
        pytest.param(
            "## Current Message\n\nUser[bob]:\nfirst\n\nUser[carol]:\nsecond\n",
            [
                "Received a Baton prompt of 58 characters with sections: Current Message.",
                "History: none.",
                'Current message from User[bob]: "first" (and 1 more message)',
            ],
            id="several-current-messages",
        ),
    ],
)
def test_standin_answer_exact_text(prompt: str, answer_lines: list[str]) -> None:
    assert standin_answer(prompt) == "\n".join([STANDIN_LABEL, *answer_lines])


SUMMARY_HISTORY = (
    "## Conversation History\n\n"
    "[omitted earlier messages: 6 (3 user, 3 assistant)]\n\n"
    "[summary of messages 1 to 6 · full transcript: .baton/history/task-7.md]\n"
    "We chose PostgreSQL.\n\\User: quoted\n\n"
    "User:\nadd the index\n\n"
    "Assistant:\ndone, see migrations/0004.py and the tests that cover it in detail\n\n"
)


def test_a_summary_block_is_named_and_its_lines_are_not_messages() -> None:
    prompt = SUMMARY_HISTORY + "## Current Message\n\nUser:\nnext?\n"
    assert standin_answer(prompt).splitlines()[2] == (
        "History: 2 messages (1 user, 1 assistant), after [omitted earlier messages: 6 "
        "(3 user, 3 assistant)] and [summary of messages 1 to 6]."
    )


def test_a_summary_request_gets_a_stand_in_summary() -> None:
    from backend.prompting.summary import SUMMARY_REQUEST_OPENING, summary_request
    from executors.standin.answer import SUMMARY_REQUEST_OPENING as STANDIN_OPENING

    assert STANDIN_OPENING == SUMMARY_REQUEST_OPENING
    request = summary_request(first_message_id=1, last_message_id=8, folds=6)
    prompt = SUMMARY_HISTORY + f"## Current Message\n\nUser:\n{request}\n"
    assert standin_answer(prompt) == "\n".join(
        [
            STANDIN_LABEL,
            "Stand-in summary of 2 messages (1 user, 1 assistant), folding in "
            "[summary of messages 1 to 6].",
            "- User: add the index",
            "- Assistant: done, see migrations/0004.py and the tests that cover it in detail",
        ]
    )
    many = "## Conversation History\n\n" + "".join(
        f"User:\nquestion {number} " + "x" * 100 + "\n\n" for number in range(25)
    )
    answer = standin_answer(many + f"## Current Message\n\nUser:\n{request}\n").splitlines()
    assert answer[1] == "Stand-in summary of 25 messages (25 user, 0 assistant)."
    assert answer[2] == "- User: question 0 " + "x" * 69 + "…"
    assert answer[-1] == "- (and 5 more messages)"


def test_a_resumed_session_is_told_apart() -> None:
    from executors.standin.answer import earlier_answers

    assert standin_answer("Add a test.", earlier_answers=2) == "\n".join(
        [
            STANDIN_LABEL,
            "Received a verbatim prompt of 11 characters; no conversation history in it.",
            "The session this continues already holds 2 earlier answers (a resumed session: "
            "Baton sent only what it had not seen).",
            'Current message: "Add a test."',
        ]
    )
    resumed = {
        "messages": [
            {"role": "user", "content": "First."},
            {"role": "assistant", "content": [{"type": "text", "text": "One."}]},
            {"role": "user", "content": "Add a test."},
        ]
    }
    assert earlier_answers("messages", resumed) == 1
    assert earlier_answers("chat", {"messages": [{"role": "user", "content": "x"}]}) == 0


def test_standin_answer_label_line() -> None:
    assert standin_answer("hi").splitlines()[0] == "[Baton stand-in model — not a real model]"


@pytest.mark.parametrize(
    ("api", "body", "prompt"),
    [
        ("responses", {"input": "plain string"}, "plain string"),
        (
            "responses",
            {
                "input": [
                    {
                        "type": "message",
                        "role": "developer",
                        "content": [{"type": "input_text", "text": "d"}],
                    },
                    {
                        "type": "message",
                        "role": "user",
                        "content": [{"type": "input_text", "text": "<env>"}],
                    },
                    {
                        "type": "message",
                        "role": "user",
                        "content": [{"type": "input_text", "text": "ask"}],
                    },
                    {"type": "function_call_output", "call_id": "c", "output": "out"},
                ]
            },
            "ask",
        ),
        ("chat", {"messages": [{"role": "system", "content": "s"}, *USER_HI]}, "hi"),
        (
            "chat",
            {"messages": [{"role": "user", "content": [{"type": "text", "text": "parts"}]}]},
            "parts",
        ),
        (
            "messages",
            {
                "messages": [
                    {"role": "system", "content": "env"},
                    {
                        "role": "user",
                        "content": [
                            {"type": "text", "text": "<system-reminder>x</system-reminder>"},
                            {"type": "text", "text": "the prompt"},
                        ],
                    },
                ]
            },
            "the prompt",
        ),
        (
            "messages",
            {
                "messages": [
                    {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t"}]}
                ]
            },
            None,
        ),
        ("chat", {}, None),
    ],
)
def test_extract_prompt(api: str, body: dict[str, Any], prompt: str | None) -> None:
    assert extract_prompt(api, body) == prompt


def test_extract_prompt_rejects_unknown_api() -> None:
    with pytest.raises(ValueError, match="unknown API"):
        extract_prompt("completions", {})


@pytest.mark.parametrize("text", ["", "one", "a b  c\n", " lead", "\n\n", "w " * 100])
def test_text_deltas_join_back_and_stay_few(text: str) -> None:
    deltas = text_deltas(text)
    assert "".join(deltas) == text
    assert len(deltas) <= MAX_TEXT_DELTAS


# -- OpenAI Responses ------------------------------------------------------------------------


def test_responses_json_and_recording(server: ModelServer) -> None:
    server.set_turns(
        [{"text": "scripted", "usage": {"input_tokens": 20, "cached_input_tokens": 5}}]
    )
    response = openai_client(server).responses.create(model="gpt-5.5", input="hello")

    assert response.output_text == "scripted"
    assert response.usage is not None
    assert (response.usage.input_tokens, response.usage.output_tokens) == (20, 7)
    assert response.usage.input_tokens_details.cached_tokens == 5
    (request,) = server.requests
    assert (request.method, request.path, request.api, request.turn_index) == (
        "POST",
        "/v1/responses",
        "responses",
        0,
    )
    assert request.headers["authorization"] == "Bearer sk-test"
    assert request.body["input"] == "hello"


def test_responses_stream_event_sequence(server: ModelServer) -> None:
    server.set_turns([{"reasoning": "thinking", "text": "two words"}])
    stream = openai_client(server).responses.create(model="gpt-5.5", input="hi", stream=True)
    events = list(stream)

    assert [event.type for event in events] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.reasoning_summary_part.added",
        "response.reasoning_summary_text.delta",
        "response.reasoning_summary_text.done",
        "response.reasoning_summary_part.done",
        "response.output_item.done",
        "response.output_item.added",
        "response.content_part.added",
        "response.output_text.delta",
        "response.output_text.delta",
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]
    assert [event.sequence_number for event in events] == list(range(len(events)))
    completed = events[-1].response
    assert completed.id.startswith("resp_")
    assert [item.type for item in completed.output] == ["reasoning", "message"]
    assert completed.output[0].summary[0].text == "thinking"
    assert completed.output_text == "two words"
    assert completed.usage.model_dump(exclude_none=True) == {
        "input_tokens": 11,
        "input_tokens_details": {"cached_tokens": 0},
        "output_tokens": 7,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": 18,
    }


def test_responses_event_lines_name_the_event(http: httpx.Client, server: ModelServer) -> None:
    body = {"model": "gpt-5.5", "input": "hi", "stream": True}
    response = http.post(f"{server.url}/v1/responses", json=body)
    assert response.headers["content-type"].startswith("text/event-stream")
    for block in response.text.strip().split("\n\n"):
        event_line, data_line = block.split("\n")
        assert event_line == f"event: {json.loads(data_line.removeprefix('data: '))['type']}"


def test_responses_tool_call_round_trip(server: ModelServer) -> None:
    server.set_turns(
        [
            {"tool": {"name": "exec_command", "arguments": {"cmd": "echo hi"}}},
            {"custom_tool": {"name": "apply_patch", "input": "*** Begin Patch\n"}},
            {"text": "done"},
        ]
    )
    client = openai_client(server)
    first = client.responses.create(model="gpt-5.5", input="run it", stream=True)
    call = [e for e in first if e.type == "response.output_item.done"][0].item
    assert (call.type, call.name, json.loads(call.arguments)) == (
        "function_call",
        "exec_command",
        {"cmd": "echo hi"},
    )
    output = {"type": "function_call_output", "call_id": call.call_id, "output": "hi\n"}
    second = client.responses.create(model="gpt-5.5", input=[output])
    assert second.output[0].type == "custom_tool_call"
    assert (second.output[0].name, second.output[0].input) == ("apply_patch", "*** Begin Patch\n")
    third = client.responses.create(model="gpt-5.5", input="next")
    assert third.output_text == "done"

    requests = server.model_requests()
    assert [request.turn_index for request in requests] == [0, 1, 2]
    assert requests[1].body["input"] == [output]


# -- Chat Completions ------------------------------------------------------------------------


def test_chat_stream_with_usage_chunk(server: ModelServer) -> None:
    server.set_turns([{"text": "streamed reply", "usage": {"input_tokens": 3, "output_tokens": 2}}])
    chunks = list(
        openai_client(server).chat.completions.create(
            model="gpt-5.5",
            messages=USER_HI,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == "streamed reply"
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "stop"
    assert chunks[-1].choices == []
    assert chunks[-1].usage is not None
    assert (chunks[-1].usage.prompt_tokens, chunks[-1].usage.completion_tokens) == (3, 2)
    assert all(c.usage is None for c in chunks[:-1])


def test_chat_stream_ends_with_done_and_no_usage_unless_asked(
    http: httpx.Client, server: ModelServer
) -> None:
    body = {"model": "gpt-5.5", "messages": USER_HI, "stream": True}
    response = http.post(f"{server.url}/v1/chat/completions", json=body)
    lines = [line for line in response.text.split("\n") if line]
    assert lines[-1] == "data: [DONE]"
    chunks = [json.loads(line.removeprefix("data: ")) for line in lines[:-1]]
    assert all("usage" not in chunk and chunk["choices"] for chunk in chunks)


def test_chat_tool_call_round_trip(server: ModelServer) -> None:
    server.set_turns([{"tool": {"name": "add", "arguments": {"a": 2, "b": 3}}}, {"text": "5"}])
    client = openai_client(server)
    chunks = list(client.chat.completions.create(model="gpt-5.5", messages=USER_HI, stream=True))
    (call_chunk,) = [c for c in chunks if c.choices and c.choices[0].delta.tool_calls]
    call = call_chunk.choices[0].delta.tool_calls[0]
    assert (call.index, call.type, call.function.name) == (0, "function", "add")
    assert json.loads(call.function.arguments) == {"a": 2, "b": 3}
    assert chunks[-1].choices[0].finish_reason == "tool_calls"

    answer = client.chat.completions.create(
        model="gpt-5.5",
        messages=[
            *USER_HI,
            {"role": "assistant", "tool_calls": [call.model_dump(exclude={"index"})]},
            {"role": "tool", "tool_call_id": call.id, "content": "5"},
        ],
    )
    assert answer.choices[0].message.content == "5"
    assert answer.choices[0].finish_reason == "stop"
    assert server.model_requests()[1].body["messages"][-1]["tool_call_id"] == call.id


def test_chat_json_tool_call(server: ModelServer) -> None:
    server.set_turns([{"text": "calling", "tool": {"name": "look", "arguments": {}}}])
    completion = openai_client(server).chat.completions.create(model="m", messages=USER_HI)
    message = completion.choices[0].message
    assert message.content == "calling"
    assert message.tool_calls[0].function.name == "look"
    assert completion.choices[0].finish_reason == "tool_calls"
    assert completion.usage is not None and completion.usage.total_tokens == 18


# -- Anthropic Messages ----------------------------------------------------------------------


def test_messages_stream_text_then_tool_use(http: httpx.Client, server: ModelServer) -> None:
    arguments = {"command": "echo hi > f.txt", "description": "write a file"}
    server.set_turns([{"text": "Running it", "tool": {"name": "Bash", "arguments": arguments}}])
    events = anthropic_events(post_messages(http, server, messages=USER_HI, stream=True))

    assert [kind for kind, _ in events] == [
        "message_start",
        "ping",
        "content_block_start",
        "content_block_delta",
        "content_block_delta",
        "content_block_stop",
        "content_block_start",
        "content_block_delta",
        "content_block_delta",
        "content_block_delta",
        "content_block_stop",
        "message_delta",
        "message_stop",
    ]
    text = "".join(d["delta"]["text"] for k, d in events[3:5])
    assert text == "Running it"
    tool_start = events[6][1]["content_block"]
    assert (tool_start["type"], tool_start["name"], tool_start["input"]) == ("tool_use", "Bash", {})
    deltas = [data["delta"] for _, data in events[7:10]]
    assert {delta["type"] for delta in deltas} == {"input_json_delta"}
    assert json.loads("".join(delta["partial_json"] for delta in deltas)) == arguments
    assert events[-2][1]["delta"]["stop_reason"] == "tool_use"
    assert events[-2][1]["usage"] == {"output_tokens": 7}
    assert events[0][1]["message"]["usage"]["input_tokens"] == 11


def test_messages_json_and_any_roles(http: httpx.Client, server: ModelServer) -> None:
    server.set_turns([{"reasoning": "hm", "text": "plain", "usage": {"cached_input_tokens": 4}}])
    messages = [{"role": "system", "content": "env"}, *USER_HI]
    response = post_messages(http, server, messages=messages, stream=False)

    assert response.status_code == 200
    message = response.json()
    assert message["type"] == "message" and message["stop_reason"] == "end_turn"
    assert [block["type"] for block in message["content"]] == ["thinking", "text"]
    assert message["content"][1]["text"] == "plain"
    assert (
        message["usage"]["input_tokens"] == 7 and message["usage"]["cache_read_input_tokens"] == 4
    )
    (request,) = server.requests
    assert (request.path, request.query) == ("/v1/messages", {"beta": "true"})
    assert request.headers["x-api-key"] == "sk-ant-test"


def test_count_tokens_and_models_consume_no_turn(http: httpx.Client, server: ModelServer) -> None:
    server.set_turns([{"text": "first"}, {"text": "second"}])
    counted = http.post(f"{server.url}/v1/messages/count_tokens", json={"messages": USER_HI})
    assert counted.status_code == 200 and counted.json()["input_tokens"] > 0
    models = openai_client(server).models.list()
    assert [model.id for model in models.data] == ["gpt-5.5", "claude-sonnet-4-5"]

    assert post_messages(http, server, messages=USER_HI).json()["content"][0]["text"] == "first"
    assert [request.api for request in server.requests] == [None, None, "messages"]


# -- script, recording and control -----------------------------------------------------------


def test_standin_mode_answers_from_the_prompt(server: ModelServer) -> None:
    client = openai_client(server)
    reply = client.chat.completions.create(
        model="m", messages=[{"role": "user", "content": HISTORY_PROMPT}]
    )
    assert reply.choices[0].message.content == standin_answer(HISTORY_PROMPT)
    assert reply.choices[0].message.tool_calls is None
    assert server.model_requests()[0].turn_index is None


def test_last_turn_repeats_and_clear_rewinds(server: ModelServer) -> None:
    server.set_turns([{"text": "one"}, {"text": "two"}])
    client = openai_client(server)

    def ask() -> str:
        return client.responses.create(model="gpt-5.5", input="q").output_text

    assert [ask(), ask(), ask()] == ["one", "two", "two"]
    assert [request.turn_index for request in server.requests] == [0, 1, 1]
    server.clear()
    assert server.requests == []
    assert ask() == "one"
    server.set_turns(None)
    assert ask().startswith(STANDIN_LABEL)


def test_unknown_route_is_recorded_with_a_404(http: httpx.Client, server: ModelServer) -> None:
    response = http.get(f"{server.url}/v1/responses?probe=1", headers={"X-Custom": "yes"})
    assert response.status_code == 404
    assert response.json()["error"]["type"] == "invalid_request_error"
    (request,) = server.requests
    assert (request.method, request.path, request.query, request.body) == (
        "GET",
        "/v1/responses",
        {"probe": "1"},
        None,
    )
    assert request.headers["x-custom"] == "yes"
    assert server.model_requests() == []


def test_chunked_request_body_is_read(http: httpx.Client, server: ModelServer) -> None:
    pieces = [b'{"model": "m", "mess', b'ages": [{"role": "user", "content": "hi"}]}']
    response = http.post(f"{server.url}/v1/chat/completions", content=iter(pieces))
    assert response.status_code == 200
    assert server.requests[0].headers["transfer-encoding"] == "chunked"
    assert server.requests[0].body["messages"] == USER_HI


def test_record_path_gets_one_json_line_per_request(http: httpx.Client, tmp_path: Path) -> None:
    record = tmp_path / "requests.jsonl"
    with ModelServer(record_path=record) as model_server:
        post_messages(http, model_server, messages=USER_HI)
        http.get(f"{model_server.url}/nowhere")
    lines = [json.loads(line) for line in record.read_text().splitlines()]
    assert [(line["path"], line["api"]) for line in lines] == [
        ("/v1/messages", "messages"),
        ("/nowhere", None),
    ]
    assert lines[0]["body"]["messages"] == USER_HI


def test_delay_and_wait_for_requests(server: ModelServer) -> None:
    server.set_turns([{"text": "slow", "delay_seconds": 0.4}])
    answers: list[str] = []

    def call() -> None:
        answers.append(openai_client(server).responses.create(model="m", input="q").output_text)

    started = time.monotonic()
    caller = threading.Thread(target=call)
    caller.start()
    (request,) = server.wait_for_requests(1, timeout=2)
    assert request.api == "responses"
    assert answers == []  # recorded on arrival, while the "model" still thinks
    caller.join(timeout=5)
    assert answers == ["slow"]
    assert time.monotonic() - started >= 0.4


def test_wait_for_requests_times_out(server: ModelServer) -> None:
    with pytest.raises(TimeoutError, match="expected 1 model requests"):
        server.wait_for_requests(1, timeout=0.05)


@pytest.mark.parametrize(
    "turn",
    [
        {"txt": "typo"},
        {},
        {"text": "x", "fail": "y"},
        {"tool": {"name": "x"}, "custom_tool": {"name": "y", "input": ""}},
        {"tool": {"arguments": {}}},
        {"tool": {"name": "x", "arguments": "[1]"}},
        {"http_status": 200},
        {"text": "x", "delay_seconds": -1},
        {"text": "x", "usage": {"tokens": 1}},
        {"context_overflow": False},
        {"text": "x", "code": "c"},
    ],
)
def test_invalid_turns_are_refused(turn: dict[str, Any]) -> None:
    with pytest.raises(ScriptError):
        ModelServer().set_turns([turn])


# -- errors ----------------------------------------------------------------------------------

OPENAI_CONTEXT_ERROR = {
    "message": "Your input exceeds the context window of this model. "
    "Please adjust your input and try again.",
    "type": "invalid_request_error",
    "code": "context_length_exceeded",
    "param": "input",
}


@pytest.mark.parametrize(
    ("path", "turn", "status", "body"),
    [
        (
            "/v1/responses",
            {"http_status": 429},
            429,
            {
                "error": {
                    "message": "Rate limit reached. Please try again in 1s.",
                    "type": "requests",
                    "code": "rate_limit_exceeded",
                    "param": None,
                }
            },
        ),
        ("/v1/responses", {"context_overflow": True}, 400, {"error": OPENAI_CONTEXT_ERROR}),
        (
            "/v1/chat/completions",
            {"http_status": 503, "message": "down", "code": "busy", "type": "server_error"},
            503,
            {"error": {"message": "down", "type": "server_error", "code": "busy", "param": None}},
        ),
        (
            "/v1/chat/completions",
            {"context_overflow": True},
            400,
            {
                "error": {
                    "message": "This model's maximum context length is 200000 tokens. However, "
                    "your messages resulted in 250000 tokens. Please reduce the length of the "
                    "messages.",
                    "type": "invalid_request_error",
                    "code": "context_length_exceeded",
                    "param": "messages",
                }
            },
        ),
        (
            "/v1/chat/completions",
            {"fail": "broken"},
            500,
            {"error": {"message": "broken", "type": "server_error", "code": None, "param": None}},
        ),
        (
            "/v1/messages",
            {"http_status": 529},
            529,
            {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}},
        ),
        (
            "/v1/messages",
            {"context_overflow": True},
            400,
            {
                "type": "error",
                "error": {
                    "type": "invalid_request_error",
                    "message": "prompt is too long: 250000 tokens > 200000 maximum",
                },
            },
        ),
        (
            "/v1/messages",
            {"fail": "broken"},
            500,
            {"type": "error", "error": {"type": "api_error", "message": "broken"}},
        ),
    ],
)
def test_error_bodies(
    http: httpx.Client,
    server: ModelServer,
    path: str,
    turn: dict[str, Any],
    status: int,
    body: dict[str, Any],
) -> None:
    server.set_turns([turn])
    for stream in (False, True):
        request = {"model": "m", "input": "q", "messages": USER_HI, "stream": stream}
        if path == "/v1/responses" and stream and "context_overflow" in turn:
            continue  # a Responses stream reports it in-band (next test)
        response = http.post(f"{server.url}{path}", json=request)
        assert (response.status_code, response.json()) == (status, body)
    assert ("retry-after" in response.headers) == (status == 429)


@pytest.mark.parametrize(
    ("turn", "error"),
    [
        ({"fail": "the model broke"}, {"code": "server_error", "message": "the model broke"}),
        (
            {"fail": "slow down", "code": "server_is_overloaded"},
            {"code": "server_is_overloaded", "message": "slow down"},
        ),
        (
            {"context_overflow": True},
            {"code": "context_length_exceeded", "message": OPENAI_CONTEXT_ERROR["message"]},
        ),
    ],
)
def test_responses_stream_fails_in_band(
    server: ModelServer, turn: dict[str, Any], error: dict[str, str]
) -> None:
    server.set_turns([turn])
    stream = openai_client(server).responses.create(model="m", input="q", stream=True)
    events = list(stream)
    assert [event.type for event in events] == ["response.created", "response.failed"]
    assert events[-1].response.status == "failed"
    assert events[-1].response.error.model_dump(exclude_none=True) == error


def test_failed_responses_without_stream_is_an_http_500(server: ModelServer) -> None:
    server.set_turns([{"fail": "the model broke"}])
    with pytest.raises(openai.InternalServerError, match="the model broke"):
        openai_client(server).responses.create(model="m", input="q")


# -- context limit ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("path", "request_body", "error"),
    [
        (
            "/v1/chat/completions",
            {"messages": [{"role": "user", "content": "x" * 41}]},
            {
                "error": {
                    "message": CHAT_CONTEXT_MESSAGE,
                    "type": "invalid_request_error",
                    "code": "context_length_exceeded",
                    "param": "messages",
                }
            },
        ),
        ("/v1/responses", {"input": "x" * 41}, {"error": OPENAI_CONTEXT_ERROR}),
        (
            "/v1/messages",
            {"messages": [{"role": "user", "content": [{"type": "text", "text": "x" * 41}]}]},
            {
                "type": "error",
                "error": {
                    "type": "invalid_request_error",
                    "message": "prompt is too long: 250000 tokens > 200000 maximum",
                },
            },
        ),
    ],
)
def test_a_prompt_over_the_context_limit_gets_the_apis_context_error(
    http: httpx.Client,
    server: ModelServer,
    path: str,
    request_body: dict[str, Any],
    error: dict[str, Any],
) -> None:
    server.set_turns([{"text": "first"}, {"text": "second"}])
    server.set_context_limit(10)  # 41 bytes: 11 tokens at four bytes a token
    refused = http.post(f"{server.url}{path}", json={"model": "m", **request_body})
    assert (refused.status_code, refused.json()) == (400, error)
    server.set_context_limit(11)
    answered = http.post(f"{server.url}{path}", json={"model": "m", **request_body})
    assert answered.status_code == 200
    assert "first" in answered.text  # the refused call consumed no turn
    calls = server.model_requests()
    assert [(call.over_context_limit, call.turn_index) for call in calls] == [
        (True, None),
        (False, 0),
    ]


def test_the_context_limit_counts_the_prompt_with_the_tokenizer_given(server: ModelServer) -> None:
    server.set_turns([{"text": "ok"}])
    server.set_context_limit(3, count_tokens=lambda text: len(text.split()))
    client = openai_client(server)
    with pytest.raises(openai.BadRequestError, match="maximum context length"):
        client.chat.completions.create(model="m", messages=[{"role": "user", "content": "a b c d"}])
    answer = client.chat.completions.create(
        model="m",
        # Only the prompt counts: the developer message is the executor's own.
        messages=[
            {"role": "developer", "content": "many words of instructions " * 50},
            {"role": "user", "content": "a b c"},
        ],
    )
    assert answer.choices[0].message.content == "ok"
    server.set_context_limit(None)
    client.chat.completions.create(model="m", messages=[{"role": "user", "content": "a b c d"}])
    assert [call.over_context_limit for call in server.model_requests()] == [True, False, False]


# -- standalone ------------------------------------------------------------------------------


def test_standalone_control_routes(http: httpx.Client) -> None:
    process = subprocess.Popen(
        [sys.executable, "-m", "executors.standin", "--port", "0"],
        cwd=REPO_ROOT,
        stdout=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        text=True,
    )
    try:
        assert process.stdout is not None
        line = process.stdout.readline().strip()
        prefix = "Baton stand-in model listening on "
        assert line.startswith(prefix + "http://127.0.0.1:")
        url = line.removeprefix(prefix)

        script = {"turns": [{"text": "scripted from outside"}]}
        assert http.post(f"{url}/_script", json=script).json() == {"ok": True, "turns": 1}
        bad = http.post(f"{url}/_script", json={"turns": [{"txt": "typo"}]})
        assert bad.status_code == 400 and "unknown turn keys" in bad.json()["error"]["message"]
        chat = {"model": "m", "messages": USER_HI}
        reply = http.post(f"{url}/v1/chat/completions", json=chat).json()
        assert reply["choices"][0]["message"]["content"] == "scripted from outside"

        (recorded,) = http.get(f"{url}/_requests").json()["requests"]
        assert (recorded["path"], recorded["api"], recorded["turn_index"]) == (
            "/v1/chat/completions",
            "chat",
            0,
        )
        assert recorded["body"] == chat
        assert http.post(f"{url}/_reset").json() == {"ok": True}
        assert http.get(f"{url}/_requests").json() == {"requests": []}
    finally:
        process.terminate()
        assert process.wait(timeout=5) == 0
