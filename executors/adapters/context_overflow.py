"""The providers' own words for a prompt over the model's context window.

Each adapter classifies its executor's output into Baton's error codes, and reads the executor's
typed signal for a context overflow first: Codex's "ran out of room in the model's context
window" (its rewrite of error code `context_length_exceeded`), Claude Code's `terminal_reason`
`prompt_too_long`, Agno's `ContextWindowExceededError`. When a provider's error reaches the
output without that signal — an OpenAI-compatible server or a proxy whose error carries no code,
which Codex prints as the HTTP body it got — the provider's wording is what is left, and Baton
must still recognise it: a context overflow is retried with a smaller prompt, any other error
with the same 400 status is not.

Each provider's wording is one named pattern, matched case-insensitively anywhere in the error
text (a message alone, or a whole JSON body). A pattern names the *input* being over the window,
never an output limit: "max_tokens is too large", "the maximum tokens you requested exceeds the
model limit", "Range of max_tokens should be" and per-minute token rate limits are other errors,
which a smaller prompt would not cure. Every pattern is the wording of a documented or reported
error body (tests/executors/provider_errors.py holds those bodies, with near misses beside them).
"""

from __future__ import annotations

import re
from dataclasses import dataclass


@dataclass(frozen=True)
class OverflowWording:
    """How one provider (or server) words "the prompt does not fit the model's window"."""

    provider: str
    pattern: re.Pattern[str]


def _wording(provider: str, regex: str) -> OverflowWording:
    return OverflowWording(provider=provider, pattern=re.compile(regex, re.IGNORECASE))


CONTEXT_OVERFLOW_WORDINGS: tuple[OverflowWording, ...] = (
    # OpenAI's error code; also sent by Azure OpenAI, Groq and vLLM, and in bodies printed whole.
    _wording("openai", r"\bcontext_length_exceeded\b"),
    # Chat Completions: "This model's maximum context length is 8192 tokens. However, …" — also
    # Azure OpenAI, DeepSeek, vLLM, and OpenRouter ("This endpoint's maximum context length is").
    _wording("openai", r"\bmaximum context length is \d+"),
    _wording("openai", r"\bexceeds the context window\b"),  # Responses
    # GPT-5's input cap: "Input tokens exceed the configured limit of 272000 tokens."
    _wording("openai", r"\binput tokens exceed the configured limit\b"),
    # Groq (and Cerebras): "Please reduce the length of the messages or completion."
    _wording("groq", r"\breduce the length of the messages or completion\b"),
    # "prompt is too long: 250000 tokens > 200000 maximum"; Claude Code's own result says so too.
    _wording("anthropic", r"\bprompt is too long\b"),
    # The prompt fits, but not with the output it may write: a smaller prompt still helps.
    _wording("anthropic", r"\binput length and `?max_tokens`? exceed context limit\b"),
    _wording("bedrock", r"\binput is too long for requested model\b"),
    # "The input token count (1200293) exceeds the maximum number of tokens allowed (1048576)."
    _wording("gemini", r"\binput token count (?:\(\d+\) )?exceeds the maximum number of tokens"),
    # "Unable to submit request because the input token count is 1251952 but model only
    # supports up to 1048576."
    _wording("vertex", r"\binput token count is \d+ but (?:the )?model only supports up to\b"),
    # "Invalid request: Your request exceeded model token limit: 262144 (requested: 336979)"
    _wording("moonshot", r"\bexceeded model token limit\b"),
    # "<400> InternalError.Algo.InvalidParameter: Range of input length should be [1, 983616]"
    _wording("dashscope", r"\brange of input length should be\b"),
    _wording("zhipu", r"\bprompt exceeds max length\b"),  # code 1261
    # "invalid params, context window exceeds limit (2013)": 2013 is MiniMax's code for any
    # invalid parameter, so only the words count.
    _wording("minimax", r"\bcontext window exceeds limit\b"),
    # "The decoder prompt (length 17772) is longer than the maximum model length of 16384."
    _wording("vllm", r"\blonger than the maximum model length\b"),
    # "the request exceeds the available context size, try increasing it", type
    # exceed_context_size_error.
    _wording("llama.cpp", r"\bexceeds the available context size\b"),
    _wording("llama.cpp", r"\bexceed_context_size_error\b"),
    # With truncate: false: {"error": "the input length exceeds the context length"}.
    _wording("ollama", r"\binput length exceeds the context length\b"),
)


def context_overflow_wording(text: str) -> OverflowWording | None:
    """The first provider wording in `text` that says the prompt is over the window, if any."""
    for wording in CONTEXT_OVERFLOW_WORDINGS:
        if wording.pattern.search(text):
            return wording
    return None


def mentions_context_overflow(text: str) -> bool:
    """Whether a provider's error text says the prompt is over the model's context window."""
    return context_overflow_wording(text) is not None
