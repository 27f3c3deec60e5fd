"""The worker's configuration: command-line flags over environment variables, read once.

Every setting the worker understands is declared here with its type and default; the rest of
the worker reads a `WorkerSettings` and never `os.environ`. Model endpoints and keys use each
ecosystem's own variable names — `OPENAI_BASE_URL` / `OPENAI_API_KEY` for Codex and Agno,
`ANTHROPIC_BASE_URL` / `ANTHROPIC_API_KEY` for Claude Code, each kind's provider in
`executors.kinds` — so a worker machine set up for those tools needs nothing new. Keys stay on
the worker: they never travel through the backend, are never logged (they are excluded from
every repr) and never reach an executor (`executors.credentials`: a worker started with them
re-executes itself without them, and executors get a per-run token for its proxy).
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Mapping, Sequence
from enum import StrEnum
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from executors.kinds import EXECUTOR_KINDS, PROVIDERS, Provider

# Passed through to every executor process; nothing else of the worker's environment is.
PASSTHROUGH_VARIABLES = (
    "PATH",
    "LANG",
    "LC_ALL",
    "LC_CTYPE",
    "TZ",
    "SSL_CERT_FILE",
    "SSL_CERT_DIR",
    "REQUESTS_CA_BUNDLE",
    "NODE_EXTRA_CA_CERTS",
    "HTTP_PROXY",
    "HTTPS_PROXY",
    "NO_PROXY",
    "http_proxy",
    "https_proxy",
    "no_proxy",
)


MAX_WORKER_ID_LENGTH = 200  # what the backend keeps (Subtask.lease_owner, NativeSession.worker_id)


def valid_worker_id(value: str) -> bool:
    """Whether `value` can name a worker: it goes on one line of the root's identity file and
    into every claim, so it is printable and not blank."""
    return 0 < len(value) <= MAX_WORKER_ID_LENGTH and value == value.strip() and value.isprintable()


class ConfigurationError(RuntimeError):
    """The flags and environment describe a worker that cannot run; the message says why."""


class StandinMode(StrEnum):
    """When executors talk to the stand-in model (`executors.standin`) instead of a provider."""

    NEVER = "never"
    AUTO = "auto"  # for each executor whose provider key is not set (what `make run` uses)
    ALWAYS = "always"


class ProviderAccess(BaseModel):
    """Where one provider's API is and the key for it (None: the provider's default / unset)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    base_url: str | None = None
    api_key: str | None = Field(None, repr=False)

    @property
    def configured(self) -> bool:
        return bool(self.base_url or self.api_key)


class WorkerSettings(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    backend_url: str
    token: str = Field(repr=False)
    # The id given with --worker-id / BATON_WORKER_ID; None: the one kept in the workspace
    # root (`executors.identity`), which the worker is known by once it holds the root.
    worker_id: str | None = Field(None, max_length=MAX_WORKER_ID_LENGTH)
    kinds: tuple[str, ...] = EXECUTOR_KINDS
    slots: int = Field(2, ge=1, le=100)
    workspace_root: Path
    once: bool = False
    # How long running turns may go on after SIGTERM before they are released.
    grace_seconds: float = Field(30.0, ge=0)
    # How often an idle worker asks for work, and how often a busy one checks its claims
    # (cancellation reaches the executor within about this long).
    poll_seconds: float = Field(1.0, gt=0)
    # How long an idle worker's dispatch waits at the backend for a turn (long polling); 0 polls
    # every poll_seconds instead. The default stays under the backend's default limit
    # (BATON_DISPATCH_MAX_WAIT_SECONDS, 30; a backend that refuses the wait gets polled) and
    # under the usual proxy read timeouts. A stop hangs up on a waiting dispatch at once.
    dispatch_wait_seconds: float = Field(20.0, ge=0, le=3600)
    claim_check_seconds: float = Field(0.5, gt=0)
    # Retries inside an executor for one model call; Baton retries whole turns itself.
    model_retries: int = Field(2, ge=0, le=10)
    standin: StandinMode = StandinMode.NEVER
    # Per provider name (`executors.kinds.PROVIDERS`): its endpoint and key.
    providers: dict[str, ProviderAccess] = Field(default_factory=dict)
    log_level: str = "INFO"
    passthrough_env: dict[str, str] = Field(default_factory=dict, repr=False)

    @field_validator("backend_url")
    @classmethod
    def _http_url(cls, value: str) -> str:
        if not value.startswith(("http://", "https://")):
            raise ValueError("must be an http:// or https:// URL of the Baton backend")
        return value.rstrip("/")

    @field_validator("worker_id")
    @classmethod
    def _printable_id(cls, value: str | None) -> str | None:
        if value is not None and not valid_worker_id(value):
            raise ValueError("must be printable text, not blank, with no surrounding spaces")
        return value

    @field_validator("kinds")
    @classmethod
    def _known_kinds(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        unknown = [kind for kind in value if kind not in EXECUTOR_KINDS]
        if unknown:
            raise ValueError(f"unknown executor kinds {unknown}; use {', '.join(EXECUTOR_KINDS)}")
        if not value:
            raise ValueError("name at least one executor kind")
        return tuple(dict.fromkeys(value))

    def provider(self, provider: Provider) -> ProviderAccess:
        """`provider`'s endpoint and key (both None when the environment names neither)."""
        return self.providers.get(provider.name, ProviderAccess(base_url=None, api_key=None))

    @property
    def state_root(self) -> Path:
        """Where this worker keeps executor homes (native sessions) and per-run temp dirs."""
        return self.workspace_root / ".worker"


def _csv(value: str) -> tuple[str, ...]:
    return tuple(item.strip() for item in value.split(",") if item.strip())


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="baton-executor",
        description=(
            "Baton's executor worker: claims turns from a Baton backend over HTTP and runs them "
            "on the OpenAI Codex CLI, Claude Code or Agno."
        ),
    )
    parser.add_argument(
        "--backend", help="Baton's base URL, e.g. http://127.0.0.1:8000 ($BATON_URL)"
    )
    parser.add_argument("--token", help="the worker account's API token ($BATON_WORKER_TOKEN)")
    parser.add_argument(
        "--token-file", help="read the token from this file ($BATON_WORKER_TOKEN_FILE)"
    )
    parser.add_argument(
        "--worker-id",
        help="this worker's name in claims, kept in the workspace root; default: the name "
        "kept there, or a new one ($BATON_WORKER_ID)",
    )
    parser.add_argument(
        "--kinds", help="executors to serve, comma-separated ($BATON_EXECUTOR_KINDS)"
    )
    parser.add_argument("--slots", type=int, help="turns run at once ($BATON_WORKER_SLOTS)")
    parser.add_argument(
        "--workspace-root", help="task workspaces live under it ($BATON_WORKSPACE_ROOT)"
    )
    parser.add_argument(
        "--once", action="store_true", default=None, help="exit 0 once nothing is pending"
    )
    parser.add_argument(
        "--grace-seconds", type=float, help="after SIGTERM ($BATON_WORKER_GRACE_SECONDS)"
    )
    parser.add_argument(
        "--standin-model",
        choices=[mode.value for mode in StandinMode],
        help="answer with Baton's stand-in model: never, auto (kinds without a key), always "
        "($BATON_STANDIN_MODEL)",
    )
    parser.add_argument("--log-level", help="($BATON_LOG_LEVEL)")
    return parser


def load_settings(
    argv: Sequence[str] | None = None, environ: Mapping[str, str] | None = None
) -> WorkerSettings:
    """Flags win over the environment; errors become one readable ConfigurationError."""
    env = os.environ if environ is None else environ
    args = _parser().parse_args(argv)

    def pick(flag: object, variable: str) -> object:
        return flag if flag is not None else env.get(variable) or None

    token = pick(args.token, "BATON_WORKER_TOKEN")
    token_file = pick(args.token_file, "BATON_WORKER_TOKEN_FILE")
    if token is None and token_file is not None:
        try:
            token = Path(str(token_file)).read_text(encoding="utf-8").strip()
        except OSError as error:
            raise ConfigurationError(f"cannot read the token file {token_file}: {error}") from None
    backend = pick(args.backend, "BATON_URL")
    missing = [
        name
        for name, value in (
            ("--backend / BATON_URL", backend),
            ("--token / BATON_WORKER_TOKEN", token),
        )
        if not value
    ]
    if missing:
        raise ConfigurationError(f"missing {' and '.join(missing)}")
    kinds = pick(args.kinds, "BATON_EXECUTOR_KINDS")
    values: dict[str, object] = {
        "backend_url": backend,
        "token": token,
        "worker_id": pick(args.worker_id, "BATON_WORKER_ID"),
        "workspace_root": Path(
            str(pick(args.workspace_root, "BATON_WORKSPACE_ROOT") or "var/workspaces")
        ).resolve(),
        "once": bool(args.once),
        "providers": {
            provider.name: ProviderAccess(
                base_url=env.get(provider.base_url_variable) or None,
                api_key=env.get(provider.api_key_variable) or None,
            )
            for provider in PROVIDERS
        },
        "passthrough_env": {name: env[name] for name in PASSTHROUGH_VARIABLES if name in env},
    }
    optional = {
        "kinds": _csv(str(kinds)) if kinds else None,
        "slots": pick(args.slots, "BATON_WORKER_SLOTS"),
        "grace_seconds": pick(args.grace_seconds, "BATON_WORKER_GRACE_SECONDS"),
        "poll_seconds": env.get("BATON_WORKER_POLL_SECONDS"),
        "dispatch_wait_seconds": env.get("BATON_WORKER_WAIT_SECONDS"),
        "claim_check_seconds": env.get("BATON_WORKER_CLAIM_CHECK_SECONDS"),
        "model_retries": env.get("BATON_MODEL_RETRIES"),
        "standin": pick(args.standin_model, "BATON_STANDIN_MODEL"),
        "log_level": pick(args.log_level, "BATON_LOG_LEVEL"),
    }
    values.update({key: value for key, value in optional.items() if value is not None})
    try:
        return WorkerSettings.model_validate(values)
    except ValidationError as error:
        problems = "; ".join(
            f"{'.'.join(str(part) for part in item['loc']) or 'settings'}: {item['msg']}"
            for item in error.errors()
        )
        raise ConfigurationError(f"invalid worker configuration: {problems}") from None
