"""The typed environment: safe local defaults, PostgreSQL by URL, a clear error in production."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from settings.environment import HISTORY_CAP_MAX, ConfigurationError, load_environment


def test_local_defaults_need_no_configuration(tmp_path):
    env = load_environment({"BATON_VAR_DIR": str(tmp_path)})
    assert env.effective_debug is True
    assert "127.0.0.1" in env.effective_allowed_hosts
    database = env.database()
    assert database["ENGINE"] == "django.db.backends.sqlite3"
    assert Path(database["NAME"]) == tmp_path / "baton.sqlite3"
    assert env.max_message_bytes == 1024 * 1024


def test_database_url_selects_postgresql():
    env = load_environment({"DATABASE_URL": "postgres://baton:s%40cret@db.internal:6543/baton"})
    database = env.database()
    assert database["ENGINE"] == "backend.postgresql"
    assert (database["NAME"], database["USER"], database["PASSWORD"]) == (
        "baton",
        "baton",
        "s@cret",
    )
    assert (database["HOST"], database["PORT"]) == ("db.internal", "6543")


def test_production_without_a_secret_refuses_to_start():
    with pytest.raises(
        ConfigurationError, match="SECRET_KEY must be set when BATON_ENV=production"
    ):
        load_environment({"BATON_ENV": "production"})


def test_production_defaults_are_strict():
    env = load_environment({"BATON_ENV": "production", "SECRET_KEY": "x" * 50})
    assert env.effective_debug is False
    assert env.effective_allowed_hosts == []
    assert env.effective_secret_key == "x" * 50
    assert env.effective_webhook_allow_private_addresses is False


@pytest.mark.parametrize(
    ("value", "public_url"),
    [
        ("https://baton.example.com/", "https://baton.example.com"),
        ("http://10.0.0.2:8000/baton", "http://10.0.0.2:8000/baton"),
        ("", None),
    ],
)
def test_the_public_url_is_a_base_without_a_trailing_slash(value, public_url):
    assert load_environment({"BATON_PUBLIC_URL": value}).public_url == public_url


@pytest.mark.parametrize(
    "value", ["baton.example.com", "ftp://baton.example.com", "https://x/?a=1"]
)
def test_a_public_url_that_is_not_a_base_is_refused(value):
    with pytest.raises(ConfigurationError, match="BATON_PUBLIC_URL"):
        load_environment({"BATON_PUBLIC_URL": value})


def test_webhooks_reach_private_addresses_in_development_or_when_set():
    assert load_environment({}).effective_webhook_allow_private_addresses is True
    production = {"BATON_ENV": "production", "SECRET_KEY": "x" * 50}
    allowed = load_environment({**production, "BATON_WEBHOOK_ALLOW_PRIVATE_ADDRESSES": "true"})
    assert allowed.effective_webhook_allow_private_addresses is True
    refused = load_environment({"BATON_WEBHOOK_ALLOW_PRIVATE_ADDRESSES": "false"})
    assert refused.effective_webhook_allow_private_addresses is False


@pytest.mark.parametrize(
    ("environ", "fragment"),
    [
        ({"DATABASE_URL": "mysql://root@localhost/db"}, "scheme 'mysql' is not supported"),
        ({"DATABASE_URL": "postgres://localhost"}, "must name a database"),
        ({"BATON_MAX_MESSAGE_BYTES": "0"}, "BATON_MAX_MESSAGE_BYTES"),
        ({"DEBUG": "perhaps"}, "DEBUG"),
    ],
)
def test_bad_values_give_a_readable_error(environ, fragment):
    with pytest.raises(ConfigurationError, match=fragment):
        load_environment(environ).database()


def test_the_orphan_grace_period_is_positive_and_an_hour_by_default():
    assert load_environment({}).artifact_orphan_grace_seconds == 3600
    environ = {"BATON_ARTIFACT_ORPHAN_GRACE_SECONDS": "600"}
    assert load_environment(environ).artifact_orphan_grace_seconds == 600
    for value in ("0", "-1", "soon"):
        with pytest.raises(ConfigurationError, match="BATON_ARTIFACT_ORPHAN_GRACE_SECONDS"):
            load_environment({"BATON_ARTIFACT_ORPHAN_GRACE_SECONDS": value})


def test_pipeline_length_has_a_bounded_setting():
    assert load_environment({}).max_pipeline_steps == 16
    assert load_environment({"BATON_MAX_PIPELINE_STEPS": "3"}).max_pipeline_steps == 3
    # pipeline_step is a small integer column: steps 0 to 32767.
    assert load_environment({"BATON_MAX_PIPELINE_STEPS": "32768"}).max_pipeline_steps == 32768
    for value in ("0", "-1", "32769", "many"):
        with pytest.raises(ConfigurationError, match="BATON_MAX_PIPELINE_STEPS"):
            load_environment({"BATON_MAX_PIPELINE_STEPS": value})


def test_the_queued_message_limit_fits_the_steers_counter():
    assert load_environment({}).max_queued_messages == 20
    # Open steers count towards it, and a turn counts them in a small integer column.
    assert load_environment({"BATON_MAX_QUEUED_MESSAGES": "32767"}).max_queued_messages == 32767
    for value in ("0", "32768", "100000"):
        with pytest.raises(ConfigurationError, match="BATON_MAX_QUEUED_MESSAGES"):
            load_environment({"BATON_MAX_QUEUED_MESSAGES": value})


HISTORY_CAPS = [
    "EXECUTOR_HISTORY_MAX_MESSAGES",
    "EXECUTOR_HISTORY_MAX_CHARS",
    "EXECUTOR_HISTORY_PER_MESSAGE_MAX_CHARS",
    "EXECUTOR_HISTORY_MAX_TOKENS",
    "EXECUTOR_HISTORY_PREVIOUS_RESULT_MAX_CHARS",
    "EXECUTOR_HISTORY_CURRENT_MESSAGE_MAX_CHARS",
    "EXECUTOR_HISTORY_SUMMARY_MAX_CHARS",
]


@pytest.mark.parametrize("variable", HISTORY_CAPS)
@pytest.mark.parametrize("value", [str(2**31), str(2**63), "0", "-1"])
def test_a_history_cap_out_of_range_refuses_to_start(variable, value):
    """A cap no policy could hold would fail every dispatch; it fails at startup instead."""
    with pytest.raises(ConfigurationError, match=variable):
        load_environment({variable: value})


@pytest.mark.parametrize("variable", HISTORY_CAPS)
def test_a_history_cap_takes_the_whole_column_range_or_none(variable):
    name = variable.removeprefix("EXECUTOR_").lower()
    assert getattr(load_environment({variable: str(2**31 - 1)}), name) == 2**31 - 1
    assert getattr(load_environment({variable: "none"}), name) is None


def test_the_budget_fraction_is_a_share_of_the_window_or_none():
    assert load_environment({}).history_max_tokens_fraction == 0.5
    environ = {"EXECUTOR_HISTORY_MAX_TOKENS_FRACTION": "0.3"}
    assert load_environment(environ).history_max_tokens_fraction == 0.3
    assert "max_tokens_fraction" in load_environment(environ).history_fields_from_environment
    environ = {"EXECUTOR_HISTORY_MAX_TOKENS_FRACTION": "none"}
    assert load_environment(environ).history_max_tokens_fraction is None
    for value in ("0", "-0.5", "1.01", "half"):
        with pytest.raises(ConfigurationError, match="EXECUTOR_HISTORY_MAX_TOKENS_FRACTION"):
            load_environment({"EXECUTOR_HISTORY_MAX_TOKENS_FRACTION": value})


def test_the_environment_bounds_history_caps_as_the_prompt_builder_does():
    from backend.prompting import MAX_CAP

    assert HISTORY_CAP_MAX == MAX_CAP


def test_summaries_from_the_environment_name_their_bot():
    with pytest.raises(ConfigurationError, match="EXECUTOR_HISTORY_SUMMARY_BOT"):
        load_environment({"EXECUTOR_HISTORY_SUMMARIES_ENABLED": "true"})
    environment = load_environment(
        {
            "EXECUTOR_HISTORY_SUMMARIES_ENABLED": "true",
            "EXECUTOR_HISTORY_SUMMARY_BOT": "summarizer",
            "EXECUTOR_HISTORY_SUMMARY_THRESHOLD_TURNS": "30",
        }
    )
    assert environment.history_fields_from_environment >= {
        "summaries_enabled",
        "summary_bot",
        "summary_threshold_turns",
    }
    with pytest.raises(ConfigurationError, match="EXECUTOR_HISTORY_SUMMARY_THRESHOLD_TURNS"):
        load_environment({"EXECUTOR_HISTORY_SUMMARY_THRESHOLD_TURNS": "0"})
    assert load_environment({"EXECUTOR_HISTORY_SUMMARY_BOT": ""}).history_summary_bot is None
    with pytest.raises(ConfigurationError, match="EXECUTOR_HISTORY_SUMMARY_BOT"):
        load_environment({"EXECUTOR_HISTORY_SUMMARY_BOT": "bot[1]"})


def test_allowed_hosts_are_a_comma_list():
    env = load_environment({"ALLOWED_HOSTS": "baton.example.org, api.example.org,"})
    assert env.effective_allowed_hosts == ["baton.example.org", "api.example.org"]


def test_the_development_access_log_leaves_out_successful_worker_polling():
    import logging

    from backend.api.log_filters import QuietWorkerPolling

    def record(line: str, status: int) -> logging.LogRecord:
        entry = logging.LogRecord(
            "django.server", logging.INFO, "", 0, '"%s" %s %s', (line, str(status), "41"), None
        )
        entry.status_code = status
        return entry

    quiet = QuietWorkerPolling()
    assert not quiet.filter(record("POST /api/executor/dispatch/ HTTP/1.1", 200))
    assert quiet.filter(record("POST /api/executor/dispatch/ HTTP/1.1", 403))
    assert quiet.filter(record("GET /api/tasks/1/ HTTP/1.1", 200))


def test_a_request_warning_is_logged_once_by_the_dev_server(tmp_path):
    """Django's default logging and Baton's root handler must not both print a request warning."""
    script = (
        "import django, logging; django.setup(); "
        "logging.getLogger('django.request').warning('Not Found: /nowhere')"
    )
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "settings", "BATON_VAR_DIR": str(tmp_path)}
    env.pop("DATABASE_URL", None)
    done = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, check=True
    )
    assert done.stderr.count("Not Found: /nowhere") == 1, done.stderr


def test_production_serves_https_behind_a_proxy_by_default():
    env = load_environment({"BATON_ENV": "production", "SECRET_KEY": "x" * 50})
    assert env.secure_proxy_ssl_header == ("HTTP_X_FORWARDED_PROTO", "https")
    assert env.effective_ssl_redirect is True
    assert env.effective_log_format == "json"


def test_development_trusts_no_proxy_header_and_logs_plain_lines():
    env = load_environment({"BATON_PROXY_SSL_HEADER": "X-Forwarded-Proto"})
    assert env.secure_proxy_ssl_header is None
    assert env.effective_ssl_redirect is False
    assert env.effective_log_format == "plain"


@pytest.mark.parametrize(
    ("header", "expected"),
    [("X-Scheme", ("HTTP_X_SCHEME", "https")), ("none", None), ("", None)],
)
def test_the_proxy_header_is_named_or_none(header, expected):
    env = load_environment(
        {"BATON_ENV": "production", "SECRET_KEY": "x" * 50, "BATON_PROXY_SSL_HEADER": header}
    )
    assert env.secure_proxy_ssl_header == expected


def test_a_proxy_header_that_is_not_a_header_name_is_refused():
    with pytest.raises(ConfigurationError, match="BATON_PROXY_SSL_HEADER"):
        load_environment({"BATON_PROXY_SSL_HEADER": "X-Forwarded-Proto: https"})


def test_artifacts_are_stored_on_the_local_disk_by_default(tmp_path):
    storage = load_environment({"BATON_VAR_DIR": str(tmp_path)}).artifact_storage()
    assert storage == {
        "BACKEND": "django.core.files.storage.FileSystemStorage",
        "OPTIONS": {"location": str(tmp_path / "artifacts")},
    }


def test_s3_storage_names_its_bucket_endpoint_and_region():
    storage = load_environment(
        {
            "BATON_ARTIFACT_STORAGE": "s3",
            "BATON_S3_BUCKET": "baton-artifacts",
            "BATON_S3_ENDPOINT_URL": "http://127.0.0.1:9000",
            "BATON_S3_REGION": "eu-west-1",
            "BATON_ARTIFACT_STORAGE_OPTIONS": '{"location": "prod", "region_name": "us-east-2"}',
        }
    ).artifact_storage()
    assert storage == {
        "BACKEND": "backend.artifacts.object_store.ArtifactS3Storage",
        "OPTIONS": {
            "bucket_name": "baton-artifacts",
            "endpoint_url": "http://127.0.0.1:9000",
            "region_name": "us-east-2",
            "location": "prod",
        },
    }
    bare = load_environment({"BATON_ARTIFACT_STORAGE": "s3", "BATON_S3_BUCKET": "b"})
    assert bare.artifact_storage()["OPTIONS"] == {"bucket_name": "b"}


@pytest.mark.parametrize(
    ("environ", "fragment"),
    [
        ({"BATON_ARTIFACT_STORAGE": "s3"}, "needs BATON_S3_BUCKET"),
        ({"BATON_ARTIFACT_STORAGE": "s3", "BATON_S3_BUCKET": " "}, "needs BATON_S3_BUCKET"),
        (
            {
                "BATON_ARTIFACT_STORAGE": "s3",
                "BATON_S3_BUCKET": "b",
                "BATON_ARTIFACT_STORAGE_BACKEND": "storages.backends.s3.S3Storage",
            },
            "leave BATON_ARTIFACT_STORAGE_BACKEND unset",
        ),
        ({"BATON_ARTIFACT_STORAGE": "gcs"}, "BATON_ARTIFACT_STORAGE"),
    ],
)
def test_an_incomplete_s3_configuration_refuses_to_start(environ, fragment):
    with pytest.raises(ConfigurationError, match=fragment):
        load_environment(environ)


def _without_pool(options: dict[str, object]) -> dict[str, object]:
    return {name: value for name, value in options.items() if name != "pool"}


def test_postgresql_prepares_statements_unless_told_not_to():
    url = {"DATABASE_URL": "postgres://baton@db/baton"}
    options = load_environment(url).database()["OPTIONS"]
    assert _without_pool(options) == {"server_side_binding": True, "prepare_threshold": 5}
    once = load_environment({**url, "BATON_DATABASE_PREPARE_THRESHOLD": "0"}).database()
    assert _without_pool(once["OPTIONS"]) == {"server_side_binding": True, "prepare_threshold": 0}
    text = load_environment({**url, "BATON_DATABASE_PREPARE_THRESHOLD": "none"}).database()
    assert _without_pool(text["OPTIONS"]) == {}
    with pytest.raises(ConfigurationError, match="BATON_DATABASE_PREPARE_THRESHOLD"):
        load_environment({**url, "BATON_DATABASE_PREPARE_THRESHOLD": "-1"})


POSTGRES_URL = {"DATABASE_URL": "postgres://baton@db/baton"}


@pytest.mark.parametrize(
    ("environ", "pool_size", "pool_timeout_seconds"),
    [
        ({}, 16, 5.0),
        ({"BATON_DATABASE_POOL_SIZE": "1"}, 1, 5.0),
        ({"BATON_DATABASE_POOL_SIZE": "40"}, 40, 5.0),
        ({"BATON_DATABASE_POOL_SIZE": "none"}, None, 5.0),
        ({"BATON_DATABASE_POOL_SIZE": ""}, None, 5.0),
        ({"BATON_DATABASE_POOL_TIMEOUT_SECONDS": "0.5"}, 16, 0.5),
        ({"BATON_DATABASE_POOL_TIMEOUT_SECONDS": "300"}, 16, 300.0),
    ],
)
def test_the_database_pool_settings(environ, pool_size, pool_timeout_seconds):
    env = load_environment(environ)
    assert (env.database_pool_size, env.database_pool_timeout_seconds) == (
        pool_size,
        pool_timeout_seconds,
    )


@pytest.mark.parametrize(
    ("environ", "fragment"),
    [
        ({"BATON_DATABASE_POOL_SIZE": "0"}, "BATON_DATABASE_POOL_SIZE"),
        ({"BATON_DATABASE_POOL_SIZE": "1001"}, "BATON_DATABASE_POOL_SIZE"),
        ({"BATON_DATABASE_POOL_SIZE": "many"}, "BATON_DATABASE_POOL_SIZE"),
        ({"BATON_DATABASE_POOL_TIMEOUT_SECONDS": "0"}, "BATON_DATABASE_POOL_TIMEOUT_SECONDS"),
        ({"BATON_DATABASE_POOL_TIMEOUT_SECONDS": "301"}, "BATON_DATABASE_POOL_TIMEOUT_SECONDS"),
        ({"BATON_DATABASE_POOL_TIMEOUT_SECONDS": "none"}, "BATON_DATABASE_POOL_TIMEOUT_SECONDS"),
    ],
)
def test_a_bad_database_pool_setting_refuses_to_start(environ, fragment):
    with pytest.raises(ConfigurationError, match=fragment):
        load_environment(environ)


def test_postgresql_connections_come_from_a_pool_per_process():
    database = load_environment(
        {
            **POSTGRES_URL,
            "BATON_DATABASE_POOL_SIZE": "12",
            "BATON_DATABASE_POOL_TIMEOUT_SECONDS": "2",
        }
    ).database()
    # Django's pool needs connections that end with their request; the pool keeps them.
    assert database["CONN_MAX_AGE"] == 0
    assert database["OPTIONS"]["pool"] == {"min_size": 1, "max_size": 12, "timeout": 2.0}
    # Statements are still prepared on the pool's connections.
    assert database["OPTIONS"]["prepare_threshold"] == 5


def test_without_a_pool_each_thread_keeps_its_postgresql_connection():
    database = load_environment({**POSTGRES_URL, "BATON_DATABASE_POOL_SIZE": "none"}).database()
    assert "pool" not in database["OPTIONS"]
    assert database["CONN_MAX_AGE"] == 60
    assert database["CONN_HEALTH_CHECKS"] is True


def test_sqlite_has_no_pool(tmp_path):
    database = load_environment(
        {"BATON_VAR_DIR": str(tmp_path), "BATON_DATABASE_POOL_SIZE": "12"}
    ).database()
    assert database["ENGINE"] == "django.db.backends.sqlite3"
    assert "pool" not in database["OPTIONS"]
    assert "CONN_MAX_AGE" not in database
