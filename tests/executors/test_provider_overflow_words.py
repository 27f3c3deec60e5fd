"""Every provider's error body through every adapter's classification, as its executor prints it.

The bodies are in `provider_errors` (overflows and near misses from the same providers). Each is
set into a recorded failure of each executor, in the place that executor prints a provider's
error: Codex's `error` notification and failed `turn/completed` (Codex prints an uncoded 400's
body verbatim; every row is given that way, so no status helps the near misses), Claude Code's
synthetic API-error message and `result` ("API Error: <status> <body>", with the status), and
the Agno runner's `run_error` (the provider's message and the HTTP status, as the openai SDK
gives them).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from executors.adapters.agno import AgnoStreamParser
from executors.adapters.claude_code_stream import ClaudeCodeStreamParser
from executors.adapters.codex_stream import CodexStreamParser
from executors.adapters.context_overflow import context_overflow_wording
from executors.events import ErrorCode, Outcome
from executors.kinds import EXECUTOR_KINDS
from tests.executors.provider_errors import NEAR_MISSES, OVERFLOW, PROVIDER_ERRORS, ProviderError

RECORDINGS = Path(__file__).resolve().parent / "recordings"
WORKSPACE = Path("/baton/workspace")
ADAPTERS = EXECUTOR_KINDS  # a kind without a replay below fails here


def _recorded(kind: str, name: str) -> list[dict[str, Any]]:
    text = (RECORDINGS / kind / f"{name}.jsonl").read_text(encoding="utf-8")
    return [json.loads(line) for line in text.splitlines()]


def _codex(row: ProviderError, state_dir: Path) -> Outcome:
    parser = CodexStreamParser(workspace=WORKSPACE, state_dir=state_dir)
    for message in _recorded("codex", "context_length_http_400"):
        if message.get("method") == "error":
            message["params"]["error"]["message"] = row.body_text
        elif message.get("method") == "turn/completed":
            message["params"]["turn"]["error"]["message"] = row.body_text
        parser.feed(json.dumps(message))
    return parser.finish(exit_code=0, stderr_tail="")  # app-server exits 0 on EOF


def _claude_code(row: ProviderError, state_dir: Path) -> Outcome:
    parser = ClaudeCodeStreamParser(workspace=WORKSPACE, state_dir=state_dir)
    text = f"API Error: {row.status} {row.body_text}"
    for message in _recorded("claude_code", "http_429"):
        if message["type"] == "assistant":
            message["message"]["content"] = [{"type": "text", "text": text}]
            message.update(error="invalid_request", api_error_status=row.status)
            message["api_error_type"] = "invalid_request_error"
        elif message["type"] == "result":
            message.update(result=text, api_error_status=row.status)
            message["api_error_type"] = "invalid_request_error"
        parser.feed(json.dumps(message))
    return parser.finish(exit_code=1, stderr_tail="")


def _agno(row: ProviderError, state_dir: Path) -> Outcome:
    parser = AgnoStreamParser()
    for message in _recorded("agno", "input_too_long_untyped"):
        if message["type"] == "run_error":
            message.update(error=row.message, http_status=row.status)
        parser.feed(json.dumps(message))
    return parser.finish(exit_code=1, stderr_tail="")


REPLAYS = {"codex": _codex, "claude_code": _claude_code, "agno": _agno}


@pytest.mark.parametrize("row", PROVIDER_ERRORS, ids=lambda row: row.id)
@pytest.mark.parametrize("kind", ADAPTERS)
def test_a_providers_error_body_is_a_context_overflow_exactly_when_it_says_so(
    kind: str, row: ProviderError, tmp_path: Path
) -> None:
    outcome = REPLAYS[kind](row, tmp_path)
    assert outcome.error_code is not None
    assert (outcome.error_code == ErrorCode.CONTEXT_OVERFLOW) is row.overflow, outcome


@pytest.mark.parametrize("row", OVERFLOW, ids=lambda row: row.id)
def test_an_overflow_is_known_by_its_message_alone(row: ProviderError) -> None:
    # Agno and proxies pass on the message without the body's code or type around it.
    assert context_overflow_wording(row.message) is not None


@pytest.mark.parametrize("row", NEAR_MISSES, ids=lambda row: row.id)
def test_a_near_miss_matches_no_wording_even_as_a_whole_body(row: ProviderError) -> None:
    assert context_overflow_wording(row.body_text) is None
    assert context_overflow_wording(row.message) is None


def test_every_provider_named_has_an_overflow_row() -> None:
    providers = {row.provider for row in OVERFLOW}
    assert providers >= {
        "openai",
        "azure_openai",
        "anthropic",
        "bedrock",
        "gemini",
        "vertex",
        "moonshot",
        "deepseek",
        "dashscope",
        "zhipu",
        "minimax",
        "groq",
        "openrouter",
        "vllm",
        "llama_cpp",
        "ollama",
    }
