"""The providers' own words for a prompt over the model's context window.

Each adapter classifies its executor's output into Baton's error codes, and reads the executor's
typed signal for a context overflow first: Codex's "ran out of room in the model's context
window" (its rewrite of error code `context_length_exceeded`), Claude Code's `terminal_reason`
`prompt_too_long`, Agno's `ContextWindowExceededError`. When a provider's error reaches the
output without that signal — an OpenAI-compatible server or a proxy whose error carries no code,
which Codex prints as the HTTP body it got — the provider's wording is what is left, and Baton
must still recognise it: a context overflow is retried with a smaller prompt, any other error
with the same 400 status is not. Each phrase below is what a provider sends (the tests replay
recorded executor output carrying them).
"""

from __future__ import annotations

CONTEXT_OVERFLOW_PHRASES = (
    "context_length_exceeded",  # OpenAI's error code, also in bodies printed whole
    "maximum context length",  # OpenAI Chat Completions; vLLM and other compatible servers
    "exceeds the context window",  # OpenAI Responses
    "prompt is too long",  # Anthropic; also Claude Code's own "Prompt is too long" result
    "exceed context limit",  # Anthropic: "input length and `max_tokens` exceed context limit"
    "input is too long for requested model",  # Amazon Bedrock
)


def mentions_context_overflow(text: str) -> bool:
    """Whether a provider's error text says the prompt is over the model's context window."""
    lowered = text.lower()
    return any(phrase in lowered for phrase in CONTEXT_OVERFLOW_PHRASES)
