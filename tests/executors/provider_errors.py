"""Error bodies of the providers people put behind Codex CLI, Claude Code and Agno.

Each row is one provider's HTTP error body as reported in public issue threads of the provider's
own repositories or of the clients that hit it (the thread is named in the row). Rows marked
`overflow` say the prompt is over the model's window; the others are near misses from the same
providers — a bad parameter, an unknown model, `max_tokens` over the model's output limit, a rate
limit, a content filter — that a smaller prompt would not cure and Baton must not requeue as a
context overflow. Numbers and request ids are as reported (ids shortened where they were long).

No documented body was found for Mistral's hosted API (only its embeddings' "Too many tokens in
batch"), so it has no row; its OpenAI-compatible servers answer in OpenAI's words, covered here.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class ProviderError:
    provider: str
    name: str
    status: int
    body: dict[str, Any]
    overflow: bool
    source: str  # where the body was reported

    @property
    def id(self) -> str:
        return f"{self.provider}-{self.name}"

    @property
    def body_text(self) -> str:
        """The body as the provider sent it (Codex prints it verbatim)."""
        return json.dumps(self.body)

    @property
    def message(self) -> str:
        """The provider's message alone, as the openai SDK hands it to Agno."""
        error = self.body.get("error", self.body)
        if isinstance(error, dict):
            message = error.get("message", "")
            return message if isinstance(message, str) else json.dumps(message)
        return str(error)


def _openai(
    message: str, kind: str = "invalid_request_error", code: Any = None, param: Any = None
) -> dict[str, Any]:
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


def _anthropic(message: str, kind: str = "invalid_request_error") -> dict[str, Any]:
    return {"type": "error", "error": {"type": kind, "message": message}}


def _google(message: str, status: str = "INVALID_ARGUMENT", code: int = 400) -> dict[str, Any]:
    return {"error": {"code": code, "message": message, "status": status}}


OVERFLOW = (
    ProviderError(
        "openai",
        "chat_context_length",
        400,
        _openai(
            "This model's maximum context length is 16385 tokens. However, your messages "
            "resulted in 16468 tokens. Please reduce the length of the messages.",
            code="context_length_exceeded",
            param="messages",
        ),
        True,
        "ChatGPTNextWeb/NextChat#2358",
    ),
    ProviderError(
        "openai",
        "gpt5_input_limit",
        400,
        _openai(
            "Input tokens exceed the configured limit of 272000 tokens. Your messages resulted "
            "in 289650 tokens. Please reduce the length of the messages.",
            param="messages",
        ),
        True,
        "cline/cline#5474",
    ),
    ProviderError(
        "openai",
        "responses_context_window",
        400,
        _openai(
            "Your input exceeds the context window of this model. Please adjust your input and "
            "try again.",
            code="context_length_exceeded",
            param="input",
        ),
        True,
        "OpenAI Responses API (executors/standin/errors.py)",
    ),
    ProviderError(
        "azure_openai",
        "context_length",
        400,
        _openai(
            "This model's maximum context length is 128000 tokens. However, your messages "
            "resulted in 204308 tokens. Please reduce the length of the messages.",
            code="context_length_exceeded",
            param="messages",
        ),
        True,
        "webtimemachine/wtm2#579 (Azure answers in OpenAI's words and code)",
    ),
    ProviderError(
        "anthropic",
        "prompt_too_long",
        400,
        _anthropic("prompt is too long: 200049 tokens > 200000 maximum"),
        True,
        "daisuke-awaji/moca#254",
    ),
    ProviderError(
        "bedrock",
        "input_too_long",
        400,
        {"message": "Input is too long for requested model."},
        True,
        "aws-samples/assessment-generator#2 (ValidationException)",
    ),
    ProviderError(
        "gemini",
        "input_token_count",
        400,
        _google(
            "The input token count (1200293) exceeds the maximum number of tokens allowed "
            "(1048576)."
        ),
        True,
        "google-gemini/gemini-cli#6678",
    ),
    ProviderError(
        "vertex",
        "input_token_count",
        400,
        _google(
            "Unable to submit request because the input token count is 1251952 but model only "
            "supports up to 1048576. Reduce the input token count and try again."
        ),
        True,
        "google-gemini/gemini-cli#19727",
    ),
    ProviderError(
        "moonshot",
        "model_token_limit",
        400,
        {
            "error": {
                "message": "Invalid request: Your request exceeded model token limit: 262144 "
                "(requested: 336979)",
                "type": "invalid_request_error",
            }
        },
        True,
        "MoonshotAI/kimi-cli#2011",
    ),
    ProviderError(
        "deepseek",
        "context_length",
        400,
        _openai(
            "This model's maximum context length is 131072 tokens. However, you requested "
            "141980 tokens (133980 in the messages, 8000 in the completion). Please reduce the "
            "length of the messages or completion.",
            code="invalid_request_error",
        ),
        True,
        "NoFxAiOS/nofx#1278",
    ),
    ProviderError(
        "dashscope",
        "input_length",
        400,
        {
            "error": {
                "code": "invalid_parameter_error",
                "message": "<400> InternalError.Algo.InvalidParameter: Range of input length "
                "should be [1, 983616]",
                "param": None,
                "type": "invalid_request_error",
            },
            "request_id": "81a373d6-28bd-9968-8335-e22a2127c41b",
        },
        True,
        "agentscope-ai/QwenPaw#6255",
    ),
    ProviderError(
        "zhipu",
        "prompt_max_length",
        400,
        {"error": {"code": "1261", "message": "Prompt exceeds max length"}},
        True,
        "zeroclaw-labs/zeroclaw#4124",
    ),
    ProviderError(
        "minimax",
        "context_window",
        400,
        {
            "type": "error",
            "error": {
                "type": "bad_request_error",
                "message": "invalid params, context window exceeds limit (2013)",
                "http_code": "400",
            },
            "request_id": "06340988ef34a8f048d8267af65d3228",
        },
        True,
        "rowboatlabs/rowboat#514",
    ),
    ProviderError(
        "groq",
        "context_length",
        400,
        _openai(
            "Please reduce the length of the messages or completion.",
            code="context_length_exceeded",
            param="messages",
        ),
        True,
        "OpenHands/OpenHands#1902",
    ),
    ProviderError(
        "openrouter",
        "endpoint_context_length",
        400,
        {
            "error": {
                "message": "This endpoint's maximum context length is 163840 tokens. However, "
                "you requested about 243013 tokens (238917 of text input, 4096 in the output). "
                'Please reduce the length of either one, or use the "middle-out" transform to '
                "compress your prompt automatically.",
                "code": 400,
            }
        },
        True,
        "continuedev/continue#10690",
    ),
    ProviderError(
        "vllm",
        "decoder_prompt",
        400,
        {
            "object": "error",
            "message": "The decoder prompt (length 17772) is longer than the maximum model "
            "length of 16384.",
            "type": "BadRequestError",
            "param": None,
            "code": 400,
        },
        True,
        "xorbitsai/inference#3785 (vLLM's validation error)",
    ),
    ProviderError(
        "llama_cpp",
        "exceed_context_size",
        400,
        {
            "error": {
                "code": 400,
                "message": "the request exceeds the available context size. try increasing "
                "the context size or enable context shift",
                "type": "exceed_context_size_error",
                "n_prompt_tokens": 14429,
                "n_ctx": 8192,
            }
        },
        True,
        "oobabooga/textgen#7257; ggml-org/llama.cpp#15780",
    ),
    ProviderError(
        "ollama",
        "input_length",
        400,
        {"error": "the input length exceeds the context length"},
        True,
        "ollama/ollama#17944 (truncate: false)",
    ),
)

NEAR_MISSES = (
    ProviderError(
        "openai",
        "max_tokens_too_large",
        400,
        _openai(
            "max_tokens is too large: 200000. This model supports at most 16384 completion "
            "tokens, whereas you provided 200000.",
            param="max_tokens",
        ),
        False,
        "OpenAI Chat Completions",
    ),
    ProviderError(
        "openai",
        "model_not_found",
        404,
        _openai(
            "The model `gpt-9` does not exist or you do not have access to it.",
            code="model_not_found",
        ),
        False,
        "OpenAI",
    ),
    ProviderError(
        "openai",
        "tpm_rate_limit",
        429,
        _openai(
            "Rate limit reached for gpt-4o in organization org-abc on tokens per min (TPM): "
            "Limit 30000, Used 25000, Requested 8000. Please try again in 6s.",
            kind="tokens",
            code="rate_limit_exceeded",
        ),
        False,
        "OpenAI",
    ),
    ProviderError(
        "azure_openai",
        "content_filter",
        400,
        _openai(
            "The response was filtered due to the prompt triggering Azure OpenAI's content "
            "management policy. Please modify your prompt and retry.",
            code="content_filter",
            param="prompt",
        ),
        False,
        "Azure OpenAI content filtering",
    ),
    ProviderError(
        "anthropic",
        "max_tokens_output_limit",
        400,
        _anthropic(
            "max_tokens: 200000 > 64000, which is the maximum allowed number of output tokens "
            "for claude-sonnet-4-5-20250929"
        ),
        False,
        "Anthropic Messages",
    ),
    ProviderError(
        "anthropic",
        "model_not_found",
        404,
        _anthropic("model: claude-sonnet-9", kind="not_found_error"),
        False,
        "Anthropic Messages",
    ),
    ProviderError(
        "bedrock",
        "max_tokens_model_limit",
        400,
        {"message": "The maximum tokens you requested exceeds the model limit of 32768"},
        False,
        "charmbracelet/crush#946",
    ),
    ProviderError(
        "bedrock",
        "throttled",
        429,
        {"message": "Too many tokens, please wait before trying again."},
        False,
        "Amazon Bedrock ThrottlingException",
    ),
    ProviderError(
        "gemini",
        "model_not_found",
        404,
        _google(
            "models/gemini-9-pro is not found for API version v1beta, or is not supported for "
            "generateContent. Call ListModels to see the list of available models and their "
            "supported methods.",
            status="NOT_FOUND",
            code=404,
        ),
        False,
        "Gemini API",
    ),
    ProviderError(
        "gemini",
        "quota",
        429,
        _google("Resource has been exhausted (e.g. check quota).", "RESOURCE_EXHAUSTED", 429),
        False,
        "Gemini API",
    ),
    ProviderError(
        "moonshot",
        "temperature",
        400,
        {
            "error": {
                "message": "invalid temperature: only 1 is allowed for this model",
                "type": "invalid_request_error",
            }
        },
        False,
        "HKUDS/nanobot#202",
    ),
    ProviderError(
        "moonshot",
        "tpm_request_too_large",
        413,
        _openai(
            "Request too large for model `moonshotai/kimi-k2-instruct` in organization "
            "`org_01` service tier `on_demand` on tokens per minute (TPM): Limit 10000, "
            "Requested 15088, please reduce your message size and try again.",
            kind="tokens",
            code="rate_limit_exceeded",
        ),
        False,
        "cline/cline#4971 (Kimi on Groq)",
    ),
    ProviderError(
        "deepseek",
        "max_tokens_range",
        400,
        _openai(
            "Invalid max_tokens value, the valid range of max_tokens is [1, 8192]",
            code="invalid_request_error",
        ),
        False,
        "deepseek-ai/DeepSeek-V3#69",
    ),
    ProviderError(
        "dashscope",
        "max_tokens_range",
        400,
        {
            "code": "InvalidParameter",
            "message": "<400> InternalError.Algo.InvalidParameter: Range of max_tokens should "
            "be [1, 8192]",
            "request_id": "fc65a002-d8fe-9701-b810-40d2285b3700",
        },
        False,
        "musistudio/claude-code-router#1327",
    ),
    ProviderError(
        "minimax",
        "tool_id_not_found",
        400,
        {
            "type": "error",
            "error": {
                "type": "bad_request_error",
                "message": "invalid params, tool result's tool id(call_function_g094w5htkglv_1) "
                "not found (2013)",
                "http_code": "400",
            },
        },
        False,
        "MiniMax-AI/MiniMax-M2#76",
    ),
    ProviderError(
        "minimax",
        "invalid_chat_setting",
        400,
        {
            "type": "error",
            "error": {
                "type": "bad_request_error",
                "message": "invalid params, invalid chat setting (2013)",
                "http_code": "400",
            },
        },
        False,
        "BigPizzaV3/CodexPlusPlus#267",
    ),
    ProviderError(
        "groq",
        "max_tokens_context_window",
        400,
        _openai(
            "max_tokens must be less than or equal to 16384, the maximum value for max_tokens "
            "is less than the context_window for this model",
            param="max_tokens",
        ),
        False,
        "RooCodeInc/Roo-Code#5729",
    ),
    ProviderError(
        "ollama",
        "model_not_found",
        404,
        {"error": 'model "llama9" not found, try pulling it first'},
        False,
        "Ollama",
    ),
)

PROVIDER_ERRORS = OVERFLOW + NEAR_MISSES
