"""The Codex CLI adapter: `codex app-server` as a subprocess, spoken to over JSON-RPC on stdio.

Why app-server and not `codex exec --json`: a running `exec` turn cannot take more user input,
while app-server has `turn/steer`, which adds input to the turn in flight, so a Baton user's
follow-up reaches the agent mid-turn (`ExecutorAdapter.steerable`). Everything else `exec`
gave is kept: one process per run, the prompt on stdin (inside the `turn/start` request, never
argv), the same events and outcome, and the process exits when Baton closes its stdin.

Verified against `openai-codex-cli-bin==0.163.0` and the stand-in model server; every override
below was checked to do what its comment says, because Codex changes behaviour between releases
(see /work/shared/EXECUTORS.md §1).

Configuration comes from `-c` overrides. app-server has no `--ignore-user-config`, so what that
flag guaranteed is kept another way: a `.codex/config.toml` in the workspace (task content) is
loaded only for a trusted project, and app-server marks the project it starts a full-access
thread in as trusted (it writes that into `$CODEX_HOME/config.toml`), after which a planted
`developer_instructions` did reach the model. The `projects` override declares the workspace
untrusted, replacing every trust entry of `$CODEX_HOME/config.toml`; then nothing is written
and the workspace's config stays unloaded, also in a state dir an earlier run had marked. The
rest of `$CODEX_HOME/config.toml` would be read too, and so would `AGENTS.override.md`,
`skills/` and `rules/` there, and `~/.profile` in the commands' login shell: a tool command can
write them all. So `CODEX_HOME` is the task's own and made afresh before each run
(`executors.homes`): only the task's session files stay (`session_files`), everything else and
all of HOME is removed (the role `--ignore-user-config` had for `exec`). The
model provider is always a custom one named `baton`, because Codex 0.163 ignores
`OPENAI_BASE_URL`.

The conversation (requests, notifications, steers) is run by the parser in `codex_stream`.
"""

from __future__ import annotations

import contextlib
import logging
import os
import uuid
from pathlib import Path

from executors.adapters.base import ExecutorAdapter, ExecutorUnavailable, Launch, RunRequest
from executors.adapters.codex_stream import (
    USAGE_STATE_DIR,
    CodexStreamParser,
    is_missing_session,
)
from executors.events import Outcome

logger = logging.getLogger(__name__)

PINNED_PACKAGE = "openai-codex-cli-bin==0.163.0"
INSTALL_HINT = (
    f"install it with `pip install 'baton[executors]'` (or `pip install {PINNED_PACKAGE}`)"
)
DEFAULT_BASE_URL = "https://api.openai.com/v1"
PROVIDER_ID = "baton"
API_KEY_VARIABLE = "OPENAI_API_KEY"  # the provider's env_key: Codex sends it as a Bearer token

# Linux refuses one argument of 128 KiB or more (MAX_ARG_STRLEN, counting the NUL).
_MAX_ARGUMENT_BYTES = 128 * 1024 - 1
_PERMISSION_MODES = ("full_access", "read_only")


class CodexAdapter(ExecutorAdapter):
    """Runs the Codex CLI bundled in the `openai-codex-cli-bin` wheel."""

    kind = "codex"
    steerable = True
    # A thread's rollout files: `thread/resume` finds the thread by them alone (checked: the
    # sqlite state Codex keeps beside them is rebuilt). Nothing else: not the sqlite files
    # (`memories_*` among them), `shell_snapshots/`, `skills/`, `rules/`, `AGENTS*.md` or
    # `config.toml`.
    session_files = ("sessions", "archived_sessions", USAGE_STATE_DIR)

    def _find(self) -> str:
        """The bundled `codex` binary's path, found once per adapter."""
        return _bundled_binary()

    def missing_session(self, outcome: Outcome) -> bool:
        return is_missing_session(outcome)

    def launch(self, request: RunRequest) -> Launch:
        """`codex app-server` on stdio; the parser writes the requests, the prompt among them.

        Raises ValueError for a request Codex cannot run as asked: an unknown permission mode, a
        resume id that is not a UUID (Codex would look for a thread of that name and fail
        later, or not at all), or instructions too long for one argument.
        """
        if request.resume_session_id is not None:
            _thread_id(request.resume_session_id)
        if request.bot.permission_mode not in _PERMISSION_MODES:
            raise ValueError(
                f"unknown permission mode {request.bot.permission_mode!r}; "
                f"expected {_PERMISSION_MODES}"
            )
        argv = [self.locate(), "app-server", *_config_flags(request)]
        # bot.max_turns is not passed: Codex 0.163 has no turn limit (no such key in the
        # binary's config schema); the worker's timeout bounds a run instead.
        for argument in argv:
            if len(os.fsencode(argument)) > _MAX_ARGUMENT_BYTES:
                raise ValueError("a Codex argument (the bot's instructions?) exceeds 128 KiB")

        state_dir = request.state_dir
        home = state_dir / "home"
        home.mkdir(parents=True, exist_ok=True)  # CODEX_HOME must exist before Codex starts
        # Nobody Baton trusts wrote it (see the module doc): it must not change this run.
        (state_dir / "config.toml").unlink(missing_ok=True)
        env = dict(request.passthrough_env)
        env.pop(API_KEY_VARIABLE, None)  # only the endpoint's key, never an inherited one
        env.update(
            {
                "CODEX_HOME": str(state_dir),
                "HOME": str(home),
                "TMPDIR": str(request.tmp_dir),
            }
        )
        if request.endpoint.api_key is not None:
            env[API_KEY_VARIABLE] = request.endpoint.api_key
        # Nothing up front: the parser writes every request once the process runs (`attach`).
        return Launch(argv=argv, env=env, cwd=request.workspace, stdin=b"", interactive=True)

    def parser(self, request: RunRequest) -> CodexStreamParser:
        resume = request.resume_session_id
        return CodexStreamParser(
            workspace=request.workspace,
            state_dir=request.state_dir,
            prompt=request.prompt,
            resume_session_id=_thread_id(resume) if resume is not None else None,
            permission_mode=request.bot.permission_mode,
        )


def _bundled_binary() -> str:
    try:
        import codex_cli_bin
    except ImportError as error:
        raise ExecutorUnavailable(f"the Codex CLI is not installed: {INSTALL_HINT}") from error
    try:
        path = codex_cli_bin.bundled_codex_path()
    except (FileNotFoundError, OSError) as error:
        raise ExecutorUnavailable(
            f"the Codex CLI package is incomplete ({error}): {INSTALL_HINT}"
        ) from error
    if not path.is_file() or not os.access(path, os.X_OK):
        raise ExecutorUnavailable(f"the Codex CLI at {path} is not executable: {INSTALL_HINT}")
    return str(path)


def _thread_id(session_id: str) -> str:
    try:
        return str(uuid.UUID(session_id))
    except ValueError:
        raise ValueError(f"{session_id!r} is not a Codex thread id (a UUID)") from None


def _config_flags(request: RunRequest) -> list[str]:
    """The `-c key=value` overrides: provider, retries, network hygiene, model, instructions."""
    endpoint = request.endpoint
    provider = f"model_providers.{PROVIDER_ID}"
    retries = max(endpoint.max_retries, 0)
    overrides = [
        f"model_provider={toml_string(PROVIDER_ID)}",
        f"{provider}.name={toml_string(PROVIDER_ID)}",
        f"{provider}.base_url={toml_string(endpoint.base_url or DEFAULT_BASE_URL)}",
        f"{provider}.wire_api={toml_string('responses')}",  # "chat" is rejected by 0.163
        f"{provider}.request_max_retries={retries}",
        f"{provider}.stream_max_retries={retries}",
        # With these three, strace showed Codex connecting only to the model endpoint: plugins
        # sync with chatgpt.com and api.github.com, analytics go to ab.chatgpt.com, and
        # unbounded connection retries would make an unreachable endpoint retry forever.
        "features.plugins=false",
        "features.unbounded_connection_retries=false",
        "analytics.enabled=false",
        # Codex passes its whole environment to the commands it runs (0.163 default): keep the
        # key away from model-written commands. Codex itself still reads it for the provider.
        f"shell_environment_policy.exclude=[{toml_string(API_KEY_VARIABLE)}]",
        # The workspace is untrusted, and the only project Codex knows: see module doc.
        f"projects={_untrusted_projects(request.workspace)}",
    ]
    if endpoint.api_key is not None:
        overrides.append(f"{provider}.env_key={toml_string(API_KEY_VARIABLE)}")
    if request.bot.model:
        overrides.append(f"model={toml_string(request.bot.model)}")
    if request.bot.instructions:
        # Arrives as its own developer message part, after Codex's built-in instructions.
        overrides.append(f"developer_instructions={toml_string(request.bot.instructions)}")
    flags: list[str] = []
    for override in overrides:
        flags += ["-c", override]
    return flags


def _untrusted_projects(workspace: Path) -> str:
    """A TOML inline table marking the workspace (as given and resolved) untrusted."""
    paths = [str(workspace)]
    with contextlib.suppress(OSError, RuntimeError):
        real = os.path.realpath(workspace)
        if real not in paths:
            paths.append(real)
    untrusted = f"{{trust_level={toml_string('untrusted')}}}"
    return "{" + ",".join(f"{toml_string(path)}={untrusted}" for path in paths) + "}"


def toml_string(value: str) -> str:
    """`value` as a TOML basic string, which is how Codex parses each `-c` value.

    Escapes what TOML forbids raw in a basic string (quote, backslash, control characters and
    DEL); other characters, non-ASCII included, pass as they are. A lone surrogate (not valid
    UTF-8, so it could not be passed at all) becomes U+FFFD.
    """
    escaped: list[str] = []
    for char in value:
        code = ord(char)
        if char in ('"', "\\"):
            escaped.append("\\" + char)
        elif code < 0x20 or code == 0x7F:
            escaped.append(f"\\u{code:04x}")
        elif 0xD800 <= code <= 0xDFFF:
            escaped.append("\ufffd")
        else:
            escaped.append(char)
    return '"' + "".join(escaped) + '"'


# -- the stream ------------------------------------------------------------------------------
