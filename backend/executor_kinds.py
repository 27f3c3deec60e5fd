"""Each executor kind Baton dispatches to, named once: everything the backend knows of it.

The model fields' choices and constraints, the API's validation, the token budget's first guess
at the executor's own overhead, whether its native sessions are resumed, and the demo data all
read `EXECUTOR_KINDS`. The worker names the same kinds once on its side of the HTTP boundary, in
`executors/kinds.py`. Adding an executor is an entry here (then `makemigrations`, since the
fields' choices change), an entry there and an adapter module.

Plain data, no Django: every layer may import it.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ExecutorKindSpec:
    """One executor kind, as the backend knows it."""

    name: str  # on the wire (dispatch requests, turns, bots) and in the database
    label: str  # what the admin and the API schema show
    # Whether a turn may resume the bot's native session on the worker that holds it
    # (`backend.dispatch.sessions`) instead of running Baton's full prompt.
    resumable: bool
    # Until a bot's usage reports teach Baton better (`backend.dispatch.budgets`): a generous
    # guess of the input tokens the executor adds of its own (system prompt, tool definitions).
    default_overhead_tokens: int
    # The model a bot of this kind names unless told otherwise (the demo bots').
    default_model: str
    # Whether a running turn takes more user input (strategy `steer`); else a steer is queued.
    steerable: bool = False


EXECUTOR_KINDS: tuple[ExecutorKindSpec, ...] = (
    ExecutorKindSpec(
        name="codex",
        label="OpenAI Codex CLI",
        resumable=True,
        default_overhead_tokens=16_000,  # Codex's base instructions and tools
        default_model="gpt-5.5",
        steerable=True,  # `turn/steer` of `codex app-server`
    ),
    ExecutorKindSpec(
        name="claude_code",
        label="Claude Code",
        resumable=True,
        default_overhead_tokens=24_000,  # Claude Code's long system prompt and tools
        default_model="claude-sonnet-4-5",
        steerable=True,  # a user message on its stream-json input
    ),
    ExecutorKindSpec(
        name="agno",
        label="Agno",
        # Agno runs keep Baton's prompt: their sessions live in the runner's own store and
        # replay tool results of earlier runs, so a resume would not save what it does for
        # the CLIs.
        resumable=False,
        default_overhead_tokens=4_000,  # Agno's instructions and file tools
        default_model="gpt-5.5",
    ),
)

KINDS: dict[str, ExecutorKindSpec] = {kind.name: kind for kind in EXECUTOR_KINDS}
NAMES: tuple[str, ...] = tuple(KINDS)
CHOICES: list[tuple[str, str]] = [(kind.name, kind.label) for kind in EXECUTOR_KINDS]
"""The (value, label) pairs of every field and serializer that holds an executor kind."""
