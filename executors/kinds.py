"""Each executor kind the worker runs, named once: its adapter, provider and stand-in wire.

A kind's entry in `KINDS` is all the worker knows of it outside its adapter module: which
`ExecutorAdapter` runs it (imported only when a worker serves the kind), whose API it talks to
(the provider's variables give its endpoint and key), and which of the stand-in model's wire
protocols it speaks. Adding an executor is one adapter module under `executors/adapters/` and one
entry here; the backend names the same kind once, in `backend/executor_kinds.py`. What only the
adapter needs — the binary and how it is found, the command line, the stream's events, the
executor's own error and missing-session words — stays in the adapter module.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from executors.adapters.base import ExecutorAdapter


@dataclass(frozen=True)
class Provider:
    """A model provider's API, as an executor's clients reach it."""

    name: str
    base_url_variable: str  # the ecosystem's own variable names, read by `executors.config`
    api_key_variable: str
    # What follows the stand-in's URL in the base URL an executor is given: OpenAI clients
    # expect `/v1` in it, Anthropic clients append `/v1/messages` themselves.
    standin_path: str
    # The provider's own API, when no base URL is configured.
    default_base_url: str
    # How a request carries the key: "authorization" (a Bearer token) or "x-api-key".
    key_header: str
    # Whether its clients append `/v1` to the base URL themselves (Anthropic's do).
    clients_append_v1: bool = False


OPENAI = Provider(
    name="openai",
    base_url_variable="OPENAI_BASE_URL",
    api_key_variable="OPENAI_API_KEY",
    standin_path="/v1",
    default_base_url="https://api.openai.com/v1",
    key_header="authorization",
)
ANTHROPIC = Provider(
    name="anthropic",
    base_url_variable="ANTHROPIC_BASE_URL",
    api_key_variable="ANTHROPIC_API_KEY",
    standin_path="",
    default_base_url="https://api.anthropic.com",
    key_header="x-api-key",
    clients_append_v1=True,
)
PROVIDERS: tuple[Provider, ...] = (OPENAI, ANTHROPIC)


@dataclass(frozen=True)
class ExecutorKind:
    """One executor kind, as the worker knows it."""

    name: str  # the kind's name on the wire: dispatch requests, turns, bots
    adapter: str  # "module:Class" of its `ExecutorAdapter`
    provider: Provider
    # The stand-in wire (`executors.standin`) its model calls arrive on: `RecordedRequest.api`.
    standin_api: str

    def new_adapter(self) -> ExecutorAdapter:
        """A fresh adapter; its module is imported here, so a worker serving one kind never
        loads the others'."""
        from executors.adapters.base import ExecutorAdapter

        module_name, _, class_name = self.adapter.partition(":")
        adapter_class = getattr(importlib.import_module(module_name), class_name)
        adapter = adapter_class()
        if not isinstance(adapter, ExecutorAdapter) or adapter.kind != self.name:
            raise TypeError(f"{self.adapter} is not the adapter of {self.name}")
        return adapter


KINDS: dict[str, ExecutorKind] = {
    kind.name: kind
    for kind in (
        ExecutorKind(
            name="codex",
            adapter="executors.adapters.codex:CodexAdapter",
            provider=OPENAI,
            standin_api="responses",
        ),
        ExecutorKind(
            name="claude_code",
            adapter="executors.adapters.claude_code:ClaudeCodeAdapter",
            provider=ANTHROPIC,
            standin_api="messages",
        ),
        ExecutorKind(
            name="agno",
            adapter="executors.adapters.agno:AgnoAdapter",
            provider=OPENAI,
            standin_api="chat",
        ),
    )
}
EXECUTOR_KINDS: tuple[str, ...] = tuple(KINDS)
