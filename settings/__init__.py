"""Django settings for Baton, derived from the typed environment in `settings.environment`."""

from __future__ import annotations

import django_stubs_ext

from backend.traffic_logs import traffic_loggers
from settings.environment import REPO_ROOT, LogFormat, load_environment

# Lets Django's generic classes be subscripted where they are used as bases
# (`admin.ModelAdmin[Task]`, `forms.ModelForm[HistoryPolicy]`), as django-stubs types them.
django_stubs_ext.monkeypatch()

BATON = load_environment()

BASE_DIR = REPO_ROOT
VAR_DIR = BATON.var_dir
VAR_DIR.mkdir(parents=True, exist_ok=True)

SECRET_KEY = BATON.effective_secret_key
DEBUG = BATON.effective_debug
ALLOWED_HOSTS = BATON.effective_allowed_hosts

# Production serves HTTPS only, behind a proxy that terminates TLS and says so in a header
# (BATON_PROXY_SSL_HEADER). The health endpoint answers plain HTTP too: a load balancer probes
# the server directly.
SECURE_PROXY_SSL_HEADER = BATON.secure_proxy_ssl_header
SECURE_SSL_REDIRECT = BATON.effective_ssl_redirect
SECURE_REDIRECT_EXEMPT = [r"^api/health/$"]
SECURE_HSTS_SECONDS = BATON.hsts_seconds if BATON.is_production else 0
SECURE_HSTS_INCLUDE_SUBDOMAINS = BATON.is_production
SECURE_HSTS_PRELOAD = BATON.hsts_preload
SESSION_COOKIE_SECURE = BATON.is_production
CSRF_COOKIE_SECURE = BATON.is_production
# Asking browsers to preload HSTS is a commitment an operator makes for the whole domain
# (BATON_HSTS_PRELOAD=true); without it, `check --deploy` would warn on every run.
SILENCED_SYSTEM_CHECKS = [] if BATON.hsts_preload else ["security.W021"]

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "rest_framework",
    "rest_framework.authtoken",
    "drf_spectacular",
    "drf_spectacular_sidecar",
    "backend.tasks",
    "backend.artifacts",
    "backend.dispatch",
    "backend.webhooks",
    "backend.api",
]

MIDDLEWARE = [
    # First, so that its check runs before any other middleware's view hook could read a body.
    "backend.api.body_limits.RequestBodyLimitMiddleware",
    # Baton's JSON errors under /api/ where DEBUG would answer Django's HTML debug pages.
    "backend.api.errors.ApiErrorsMiddleware",
    "django.middleware.security.SecurityMiddleware",
    # Static files (the admin's, the API docs') from STATIC_ROOT, without DEBUG.
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]

ROOT_URLCONF = "backend.urls"
WSGI_APPLICATION = "backend.wsgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

DATABASES = {"default": BATON.database()}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
]

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

STATIC_URL = "static/"
STATIC_ROOT = VAR_DIR / "static"
# `collectstatic` fills it (make serve); WhiteNoise serves what it finds there.
STATIC_ROOT.mkdir(exist_ok=True)

STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    # Production stores static files compressed, under names that carry their hash, so they
    # can be cached for ever; elsewhere they are served as they are, without collectstatic.
    "staticfiles": {
        "BACKEND": (
            "whitenoise.storage.CompressedManifestStaticFilesStorage"
            if BATON.is_production
            else "django.contrib.staticfiles.storage.StaticFilesStorage"
        )
    },
    "artifacts": BATON.artifact_storage(),
}

# Baton's own limits.
BATON_MAX_MESSAGE_BYTES = BATON.max_message_bytes
BATON_MAX_RESULT_BYTES = BATON.max_result_bytes
BATON_REQUEST_BODY_TIMEOUT_SECONDS = BATON.request_body_timeout_seconds
# Each endpoint has its own request body limit, derived from the limits above and checked
# before the body is read (backend.api.body_limits); Django's one limit for every request is
# left to it.
DATA_UPLOAD_MAX_MEMORY_SIZE = None
# Ingestion: text longer than this is stored whole as an artifact; the turn keeps a preview.
BATON_SPILL_THRESHOLD_CHARS = BATON.spill_threshold_chars
BATON_PREVIEW_HEAD_CHARS = BATON.preview_head_chars
BATON_PREVIEW_TAIL_CHARS = BATON.preview_tail_chars
# prune_artifacts removes stored files no artifact row owns once they are this old; younger
# ones may belong to a write whose row is not committed yet.
BATON_ARTIFACT_ORPHAN_GRACE_SECONDS = BATON.artifact_orphan_grace_seconds
# A page of a task's turns stops before its turns' JSON would pass this many bytes (it always
# holds at least one turn); `next` continues after the last turn it holds.
BATON_API_PAGE_MAX_BYTES = BATON.api_page_max_bytes
# Steps a task's pipeline may have: each is one turn per message, created in one request.
BATON_MAX_PIPELINE_STEPS = BATON.max_pipeline_steps
# What a follow-up sent while a turn runs does (`backend.tasks.follow_up_strategies`), unless
# the task or the follow-up says; at most this many wait queued per task.
BATON_FOLLOW_UP_STRATEGY = BATON.follow_up_strategy.value
BATON_MAX_QUEUED_MESSAGES = BATON.max_queued_messages
# GET /api/tasks/{id}/events/: streams one server process serves at once, and for how long.
BATON_MAX_EVENT_STREAMS = BATON.max_event_streams
BATON_EVENT_STREAM_SECONDS = BATON.event_stream_seconds

# History policy defaults (used when no HistoryPolicy row applies) and the kill switch.
EXECUTOR_HISTORY_ENABLED = BATON.history_enabled
EXECUTOR_HISTORY_DEFAULTS = {
    "max_messages": BATON.history_max_messages,
    "max_chars": BATON.history_max_chars,
    "per_message_max_chars": BATON.history_per_message_max_chars,
    "max_tokens": BATON.history_max_tokens,
    "max_tokens_fraction": BATON.history_max_tokens_fraction,
    "token_encoding": BATON.history_token_encoding,
    "keep_first_user_message": BATON.history_keep_first_user_message,
    "previous_result_max_chars": BATON.history_previous_result_max_chars,
    "current_message_max_chars": BATON.history_current_message_max_chars,
    "summaries_enabled": BATON.history_summaries_enabled,
    "summary_bot": BATON.history_summary_bot,
    "summary_threshold_turns": BATON.history_summary_threshold_turns,
    "summary_max_chars": BATON.history_summary_max_chars,
}
# The defaults above that the operator set in the environment (the others are built in).
EXECUTOR_HISTORY_FROM_ENVIRONMENT = BATON.history_fields_from_environment
# Executor workers: how long a claim lasts without a heartbeat, and how many claims a turn
# gets before it fails.
BATON_LEASE_SECONDS = BATON.lease_seconds
BATON_MAX_ATTEMPTS = BATON.max_attempts
# A retryable failure (HTTP 429 / 5xx from the model, a network error) requeues the turn after
# base * 2^(attempt - 1) seconds, at most the maximum.
BATON_RETRY_BACKOFF_SECONDS = BATON.retry_backoff_seconds
BATON_RETRY_BACKOFF_MAX_SECONDS = BATON.retry_backoff_max_seconds
# A turn whose prompt overflowed the model's context window is requeued with half the budget
# (a fresh native session) this many times before it fails; these retries use no attempt.
BATON_CONTEXT_OVERFLOW_RETRIES = BATON.context_overflow_retries
# A turn whose bot has a live native session on worker W waits this long for W to claim it
# (W can resume the session); after that any worker may run it fresh.
BATON_SESSION_AFFINITY_SECONDS = BATON.session_affinity_seconds
# An idle worker's dispatch may wait up to this long for a turn (its `wait_seconds`); each
# waiting request holds one server thread meanwhile.
BATON_DISPATCH_MAX_WAIT_SECONDS = BATON.dispatch_max_wait_seconds
# A server process remembers an API token's account (and whether it is a worker) this long,
# so a busy worker's requests skip the token and group lookups. A token deleted, an account
# deactivated or moved out of the worker group takes effect at once in the process that made
# the change and within this many seconds in the others; 0 looks the token up every time.
BATON_TOKEN_CACHE_SECONDS = BATON.token_cache_seconds
# Webhooks (backend/webhooks): a delivery that fails is tried again after
# base * 2^(attempt - 1) seconds, at most the maximum, and is `failed` after the last attempt;
# each POST waits at most the timeout.
BATON_WEBHOOK_MAX_ATTEMPTS = BATON.webhook_max_attempts
BATON_WEBHOOK_BACKOFF_SECONDS = BATON.webhook_backoff_seconds
BATON_WEBHOOK_BACKOFF_MAX_SECONDS = BATON.webhook_backoff_max_seconds
BATON_WEBHOOK_TIMEOUT_SECONDS = BATON.webhook_timeout_seconds
BATON_PUBLIC_URL = BATON.public_url
BATON_WEBHOOK_ALLOW_PRIVATE_ADDRESSES = BATON.effective_webhook_allow_private_addresses

REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "backend.api.authentication.CachedTokenAuthentication",
        "rest_framework.authentication.SessionAuthentication",
    ],
    "DEFAULT_PERMISSION_CLASSES": ["rest_framework.permissions.IsAuthenticated"],
    # DRF's JSONParser, refusing bodies nested more than 100 levels deep (400 parse_error).
    "DEFAULT_PARSER_CLASSES": ["backend.api.parsers.BatonJSONParser"],
    "DEFAULT_RENDERER_CLASSES": [
        "backend.api.renderers.BatonJSONRenderer",
        "rest_framework.renderers.BrowsableAPIRenderer",
    ],
    "DEFAULT_PAGINATION_CLASS": "backend.api.pagination.TaskPagination",
    # Adds the errors every operation of a kind answers (backend/api/schema.py).
    "DEFAULT_SCHEMA_CLASS": "backend.api.schema.BatonAutoSchema",
    "EXCEPTION_HANDLER": "backend.api.errors.api_exception_handler",
    "TEST_REQUEST_DEFAULT_FORMAT": "json",
}

SPECTACULAR_SETTINGS = {
    "TITLE": "Baton API",
    "DESCRIPTION": (
        "Multi-turn agent task backend: tasks and their turns, bounded prompts, executor dispatch."
    ),
    "VERSION": "0.1.0",
    "SERVE_INCLUDE_SCHEMA": False,
    # The API description is public; every endpoint it describes still needs a token.
    "SERVE_PERMISSIONS": ["rest_framework.permissions.AllowAny"],
    # Served from the sidecar package so the docs page works without internet access.
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
    # Ids in a path (`<id:...>`, backend/api/urls.py) are integers.
    "PATH_CONVERTER_OVERRIDES": {"id": int},
    "ENUM_NAME_OVERRIDES": {
        "ExecutorKindEnum": "backend.executor_kinds.CHOICES",
        # Tasks and turns share one set of statuses.
        "StatusEnum": "backend.tasks.models.TaskStatus",
        "ReportedStatusEnum": ["COMPLETED", "FAILED", "RETRY", "RELEASE"],
        "ContextPassingEnum": "backend.tasks.models.CONTEXT_PASSING_CHOICES",
        "SubtaskKindEnum": "backend.tasks.models.SubtaskKind",
        "PromptKindEnum": "backend.dispatch.models.PROMPT_KINDS",
        "FollowUpStrategyEnum": "backend.tasks.follow_up_strategies.FollowUpStrategy",
        # Artifacts keep the name their kinds had before turns had a kind too.
        "KindEnum": "backend.artifacts.models.ARTIFACT_KIND_CHOICES",
        # Each part of GET /api/health/.
        "HealthPartEnum": ["ok", "failed"],
        # Webhook event types and delivery statuses.
        "WebhookEventEnum": "backend.webhooks.models.EventType",
        "DeliveryStatusEnum": "backend.webhooks.models.DeliveryStatus",
    },
}

# JSON lines (backend.log_format) in production, readable lines in development.
LOG_FORMATTER = "json" if BATON.effective_log_format is LogFormat.JSON else "plain"

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {
        "json": {"()": "backend.log_format.JsonLineFormatter"},
        # A Baton event as one short line (backend.log_format.PlainLineFormatter).
        "plain": {"()": "backend.log_format.PlainLineFormatter"},
        "django.server": {
            "()": "django.utils.log.ServerFormatter",
            "format": "[{server_time}] {message}",
            "style": "{",
        },
    },
    "filters": {
        "quiet_worker_polling": {"()": "backend.api.log_filters.QuietWorkerPolling"},
        # No URL, header or body of Baton's traffic from httpx, urllib3, botocore and the like.
        "withhold_traffic_text": {"()": "backend.traffic_logs.WithholdTrafficText"},
        # The plain console leaves the dispatch's long-polling plumbing out at INFO.
        "quiet_plumbing_events": {"()": "backend.log_format.QuietPlumbingEvents"},
    },
    "handlers": {
        "console": {
            "class": "logging.StreamHandler",
            "formatter": LOG_FORMATTER,
            "filters": [
                "withhold_traffic_text",
                *(["quiet_plumbing_events"] if LOG_FORMATTER == "plain" else []),
            ],
        },
        # runserver's access log, without the successful polling of a worker beside it.
        "django.server": {
            "class": "logging.StreamHandler",
            "formatter": "json" if LOG_FORMATTER == "json" else "django.server",
            "filters": ["quiet_worker_polling", "withhold_traffic_text"],
        },
    },
    "loggers": {
        # Django's own default config also gives the "django" logger a console handler (in
        # DEBUG); replacing it here means each request warning is printed once, by the root's.
        "django": {"handlers": [], "level": "INFO", "propagate": True},
        "django.server": {"handlers": ["django.server"], "level": "INFO", "propagate": False},
        # The HTTP libraries' request lines are never made into records (backend.traffic_logs).
        **traffic_loggers(BATON.log_level),
    },
    "root": {"handlers": ["console"], "level": BATON.log_level},
}
