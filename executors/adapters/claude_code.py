"""The Claude Code adapter: `claude -p` with stream-json input and output, mapped onto Baton's
events, whose running turn Baton can steer.

Verified against Claude Code 2.1.332 (bundled in `claude-agent-sdk==0.2.189`) and the stand-in
model server; each flag and variable below was checked to do what its comment says, because
Claude Code changes behaviour between releases (see /work/shared/EXECUTORS.md §2).

The binary is the one the SDK wheel bundles, found without importing `claude_agent_sdk` (that
import alone takes about a second). The prompt goes to stdin, the bot's instructions to a file in
the run's private tmp dir: neither may be an argument, since Linux refuses one of 128 KiB or more.

Configuration comes from the command line and the environment only. `--setting-sources ""`
keeps Claude Code from reading any settings file or CLAUDE.md: not the workspace's
(`.claude/settings.json`, `CLAUDE.md`: task content) and not the user's in `CLAUDE_CONFIG_DIR`
(`settings.json`, `CLAUDE.md`), which a tool command can write. Without it, such a
`settings.json` ran its hooks even in read_only mode, and its `env` redirected
`ANTHROPIC_BASE_URL` — with our API key — to another host; with `user` (this adapter's choice
before) the user's were still read, also one the running agent had just written. The
`CLAUDE_CONFIG_DIR` is besides the task's own state dir, made afresh before each run
(`executors.homes`): anything but the task's session transcripts that a tool command wrote there
(agents, commands, skills, plugins, `.claude.json`) is gone by the next run, as is all of HOME.

The stream it prints is read in `claude_code_stream`; what goes to its stdin, and how a steer
reaches the running turn, is `claude_code_steering`.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path, PurePosixPath

from executors.adapters.base import ExecutorAdapter, ExecutorUnavailable, Launch, RunRequest
from executors.adapters.claude_code_steering import user_message_line
from executors.adapters.claude_code_stream import (
    USAGE_STATE_DIR,
    ClaudeCodeStreamParser,
    is_missing_session,
)
from executors.events import Outcome

PINNED_PACKAGE = "claude-agent-sdk==0.2.189"
INSTALL_HINT = (
    f"install it with `pip install 'baton[executors]'` (or `pip install {PINNED_PACKAGE}`)"
)
SDK_PACKAGE = "claude_agent_sdk"
BUNDLED_BINARY = PurePosixPath("_bundled") / "claude"
INSTRUCTIONS_FILE = "baton-instructions.md"  # in the run's tmp dir; see launch()

_PERMISSION_MODES = ("full_access", "read_only")
# The only built-in tools a read_only run gets: they read files and cannot change any.
_READ_ONLY_TOOLS = "Read,Glob,Grep"


class ClaudeCodeAdapter(ExecutorAdapter):
    """Runs the Claude Code binary bundled in the `claude-agent-sdk` wheel."""

    kind = "claude_code"
    steerable = True
    # Session transcripts (and each session's own directory beside it), not the project's
    # `memory/`; nothing else: not `settings.json`, `CLAUDE.md`, `.claude.json`, agents,
    # commands, skills, hooks or plugins.
    session_files = (
        "projects/*/*.jsonl",
        "projects/*/????????-????-????-????-????????????",
        USAGE_STATE_DIR,
    )

    def _find(self) -> str:
        """The bundled `claude` binary's path, found once per adapter."""
        return _bundled_binary()

    def missing_session(self, outcome: Outcome) -> bool:
        return is_missing_session(outcome)

    def launch(self, request: RunRequest) -> Launch:
        """`claude -p` in stream-json mode, interactive, with the prompt as the first user
        message on stdin.

        Side effects, both inside directories the worker gave this run: creates
        `<state_dir>/home` (HOME must exist) and writes the bot's instructions, when it has any,
        to `<tmp_dir>/baton-instructions.md` for `--append-system-prompt-file`.
        Raises ValueError for an unknown permission mode.
        """
        binary = self.locate()
        bot = request.bot
        argv = [
            binary,
            "-p",
            # User messages as JSON lines on stdin: the prompt, then any steers.
            "--input-format",
            "stream-json",
            "--output-format",
            "stream-json",
            "--verbose",  # stream-json in -p mode requires it
            "--include-partial-messages",  # text deltas as `stream_event` lines
            # Read no settings file or CLAUDE.md, the workspace's or the user's (hooks, env,
            # permissions, instructions): see module doc.
            "--setting-sources",
            "",
            # Render the system prompt on every run: with the default ("on") a resumed session
            # reused the first run's text, so edited bot instructions never reached the model.
            "--system-prompt-snapshot",
            "off",
            *_permission_flags(bot.permission_mode),
        ]
        if bot.model:
            argv += ["--model", bot.model]
        if bot.instructions:
            # Appended to Claude Code's own system prompt (which teaches it its tools), read from
            # a file so that instructions of any length work and stay out of `ps`.
            instructions = request.tmp_dir / INSTRUCTIONS_FILE
            # A lone surrogate cannot be UTF-8: it becomes "?" rather than failing the run.
            instructions.write_text(bot.instructions, encoding="utf-8", errors="replace")
            argv += ["--append-system-prompt-file", str(instructions)]
        if bot.max_turns is not None:
            argv += ["--max-turns", str(bot.max_turns)]
        if request.resume_session_id is not None:
            argv += ["--resume", request.resume_session_id]

        home = request.state_dir / "home"
        home.mkdir(parents=True, exist_ok=True)
        return Launch(
            argv=argv,
            env=_environment(request, home=home),
            cwd=request.workspace,
            stdin=user_message_line(request.prompt),
            interactive=True,
        )

    def parser(self, request: RunRequest) -> ClaudeCodeStreamParser:
        return ClaudeCodeStreamParser(workspace=request.workspace, state_dir=request.state_dir)


def _bundled_binary() -> str:
    spec = importlib.util.find_spec(SDK_PACKAGE)
    locations = spec.submodule_search_locations if spec is not None else None
    if not locations:
        raise ExecutorUnavailable(f"Claude Code is not installed: {INSTALL_HINT}")
    path = Path(locations[0]) / BUNDLED_BINARY
    if not path.is_file() or not os.access(path, os.X_OK):
        raise ExecutorUnavailable(
            f"the Claude Code binary is missing or not executable at {path}: {INSTALL_HINT}"
        )
    return str(path)


def _permission_flags(permission_mode: str) -> list[str]:
    if permission_mode == "full_access":
        # Every tool runs without asking (nobody could answer a prompt in -p mode anyway).
        return ["--permission-mode", "bypassPermissions"]
    if permission_mode == "read_only":
        # Only the reading tools exist: the model is offered no Bash, Write, Edit, subagents or
        # web tools, and a call to one fails with "No such tool available". dontAsk refuses
        # whatever is not pre-approved instead of prompting, and with no --allowedTools that
        # includes reading outside the workspace.
        return ["--permission-mode", "dontAsk", "--tools", _READ_ONLY_TOOLS]
    raise ValueError(f"unknown permission mode {permission_mode!r}; expected {_PERMISSION_MODES}")


def _environment(request: RunRequest, *, home: Path) -> dict[str, str]:
    """The whole environment: the worker's pass-through variables plus Claude Code's own."""
    endpoint = request.endpoint
    env = dict(request.passthrough_env)
    for name in ("ANTHROPIC_BASE_URL", "ANTHROPIC_API_KEY"):
        env.pop(name, None)  # only the endpoint's, never inherited ones
    env.update(
        {
            "CLAUDE_CONFIG_DIR": str(request.state_dir),  # sessions: projects/<cwd-slug>/<id>.jsonl
            "HOME": str(home),
            # Claude Code leaves sockets and probe dirs in TMPDIR, stale ones after a kill.
            "TMPDIR": str(request.tmp_dir),
            # With this, strace showed one connection only: to the model endpoint (no
            # `HEAD /api/hello`, no api.anthropic.com telemetry). The three below are
            # belt and braces for the same.
            "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
            "DISABLE_AUTOUPDATER": "1",
            "DISABLE_TELEMETRY": "1",
            "DISABLE_ERROR_REPORTING": "1",
            "CLAUDE_CODE_MAX_RETRIES": str(max(endpoint.max_retries, 0)),
        }
    )
    if endpoint.base_url:
        env["ANTHROPIC_BASE_URL"] = _anthropic_base_url(endpoint.base_url)
    if endpoint.api_key is not None:
        env["ANTHROPIC_API_KEY"] = endpoint.api_key  # sent as x-api-key
    if request.bot.permission_mode == "full_access" and os.geteuid() == 0:
        # As root, bypassPermissions exits at once ("cannot be used with root/sudo privileges")
        # unless Claude Code is told it runs in a sandbox.
        env["IS_SANDBOX"] = "1"
    return env


def _anthropic_base_url(base_url: str) -> str:
    """The endpoint without a trailing `/v1`: Claude Code appends `/v1/messages` itself.

    Other executors' endpoints are given with `/v1`; tolerating one here avoids `/v1/v1/…`.
    """
    url = base_url.rstrip("/")
    return url.removesuffix("/v1")
