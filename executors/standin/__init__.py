"""The stand-in model server that Baton ships for demos and tests.

`ModelServer` speaks the three wire protocols Baton's executors use — OpenAI Responses (Codex
CLI), Chat Completions (Agno) and Anthropic Messages (Claude Code) — on a loopback port. Tests
script its answers turn by turn and assert on the requests it recorded; without a script it
answers with `standin_answer`, a clearly labelled, deterministic description of the prompt it
received, so a demo runs end to end without any model provider. Standard library only: it never
imports Django or the backend, and `python -m executors.standin` runs it on its own.
"""

from executors.standin.answer import STANDIN_LABEL, extract_prompt, standin_answer
from executors.standin.script import ScriptError
from executors.standin.server import ModelServer, RecordedRequest

__all__ = [
    "STANDIN_LABEL",
    "ModelServer",
    "RecordedRequest",
    "ScriptError",
    "extract_prompt",
    "standin_answer",
]
