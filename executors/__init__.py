"""Baton's executor worker.

It claims turns from a Baton backend over HTTP (never by importing the backend), prepares each
task's workspace, runs the turn on a real executor — OpenAI Codex CLI, Claude Code or Agno —
streams normalized progress back, and reports one outcome per claim. `python -m executors` and
the `baton-executor` console script start it; `executors.standin` is the stand-in model server
used for demos and tests when no model provider is configured.
"""
