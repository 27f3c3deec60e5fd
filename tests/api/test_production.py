"""Production mode: `check --deploy` is clean, and behind gunicorn (gthread workers, as
`make serve` runs it) the health endpoint, the admin's static files and JSON log lines work.

The health endpoint's failures are tested in-process, with an artifact storage that fails.
"""

from __future__ import annotations

import errno
import http.client
import json
import logging
import os
import secrets
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from django.core.files import File
from django.core.files.storage import FileSystemStorage

REPO_ROOT = Path(__file__).resolve().parents[2]
HANG_GUARD_SECONDS = 30
HEALTHY = {"status": "ok", "database": "ok", "artifacts": "ok"}


def production_env(var_dir: Path, **overrides: str) -> dict[str, str]:
    env = {
        **os.environ,
        "BATON_ENV": "production",
        "SECRET_KEY": secrets.token_urlsafe(50),
        "ALLOWED_HOSTS": "baton.example.com,127.0.0.1",
        "DATABASE_URL": "",
        "BATON_VAR_DIR": str(var_dir),
        **overrides,
    }
    for name in ("DJANGO_SETTINGS_MODULE", "DEBUG", "BATON_SSL_REDIRECT", "BATON_LOG_FORMAT"):
        if name not in overrides:
            env.pop(name, None)
    return env


def manage(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "manage.py", *args],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
    )


# --- settings -----------------------------------------------------------------------------------


def test_check_deploy_is_clean_in_production(tmp_path):
    checked = manage(production_env(tmp_path), "check", "--deploy", "--fail-level", "WARNING")
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "System check identified no issues" in checked.stdout


def test_check_deploy_warns_when_https_is_turned_off(tmp_path):
    """The check above is not clean by default: without the redirect it says so."""
    env = production_env(tmp_path, BATON_SSL_REDIRECT="false")
    checked = manage(env, "check", "--deploy", "--fail-level", "WARNING")
    assert checked.returncode != 0
    assert "security.W008" in checked.stderr


def test_production_without_a_secret_key_says_what_to_set(tmp_path):
    env = production_env(tmp_path)
    del env["SECRET_KEY"]
    checked = manage(env, "check")
    assert checked.returncode != 0
    assert "SECRET_KEY must be set when BATON_ENV=production" in checked.stderr


# --- the health endpoint, in-process ------------------------------------------------------------


class ReadOnlyStorage(FileSystemStorage):
    """Refuses every write, as a read-only mount does."""

    def _save(self, name: str, content: File) -> str:
        raise OSError(errno.EROFS, os.strerror(errno.EROFS), self.path(name))


@pytest.mark.django_db
def test_health_is_ok_without_an_account_and_leaves_no_file(client, artifact_storage_in_tmp):
    response = client.get("/api/health/", HTTP_AUTHORIZATION="Token not-a-token")
    assert response.status_code == 200
    assert response.json() == HEALTHY
    assert response["Cache-Control"] == "no-store"
    assert [path for path in artifact_storage_in_tmp.rglob("*") if path.is_file()] == []


@pytest.mark.django_db
def test_health_is_503_naming_the_storage_when_it_takes_no_write(
    client, settings, artifact_storage_in_tmp, caplog
):
    settings.STORAGES = {
        **settings.STORAGES,
        "artifacts": {
            "BACKEND": f"{__name__}.ReadOnlyStorage",
            "OPTIONS": {"location": str(artifact_storage_in_tmp)},
        },
    }
    with caplog.at_level(logging.INFO, logger="baton.events"):
        response = client.get("/api/health/")
    assert response.status_code == 503
    assert response.json() == {"status": "unavailable", "database": "ok", "artifacts": "failed"}
    [event] = [
        json.loads(record.getMessage())
        for record in caplog.records
        if record.name == "baton.events"
    ]
    assert event == {"event": "health_check_failed", "part": "artifacts", "error_type": "OSError"}
    assert str(artifact_storage_in_tmp) not in caplog.text


@pytest.mark.django_db
def test_the_https_redirect_spares_the_health_endpoint(client, settings):
    settings.SECURE_SSL_REDIRECT = True
    assert client.get("/api/health/").status_code == 200
    redirected = client.get("/api/tasks/")
    assert redirected.status_code == 301
    assert redirected["Location"] == "https://testserver/api/tasks/"


# --- behind gunicorn ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Production:
    port: int
    access_log: Path  # gunicorn's stdout
    error_log: Path  # its stderr: gunicorn's own lines and the app's


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.fixture(scope="module")
def production(tmp_path_factory) -> Iterator[Production]:
    """`make serve`'s steps: migrate, collectstatic, gunicorn with backend.gunicorn_conf.

    Plain HTTP on loopback, so the HTTPS redirect is off (BATON_SSL_REDIRECT=false).
    """
    var_dir = tmp_path_factory.mktemp("production")
    env = production_env(var_dir, BATON_SSL_REDIRECT="false")
    for step in (["migrate", "--noinput"], ["collectstatic", "--noinput"]):
        done = manage(env, *step, "--verbosity", "0")
        assert done.returncode == 0, done.stderr
    port = _free_port()
    access_log, error_log = var_dir / "stdout.log", var_dir / "stderr.log"
    with access_log.open("wb") as stdout, error_log.open("wb") as stderr:
        server = subprocess.Popen(
            [sys.executable, "-m", "gunicorn", "backend.wsgi"]
            + ["--config", "python:backend.gunicorn_conf", "--bind", f"127.0.0.1:{port}"]
            + ["--workers", "1", "--threads", "4"],
            cwd=REPO_ROOT,
            env=env,
            stdout=stdout,
            stderr=stderr,
        )
    try:
        deadline = time.monotonic() + HANG_GUARD_SECONDS
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if time.monotonic() > deadline or server.poll() is not None:
                    raise AssertionError("gunicorn did not start") from None
                time.sleep(0.1)
        yield Production(port, access_log, error_log)
    finally:
        server.terminate()
        try:
            server.wait(timeout=HANG_GUARD_SECONDS)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()


def get(production: Production, path: str, **headers: str) -> tuple[int, dict[str, str], bytes]:
    connection = http.client.HTTPConnection("127.0.0.1", production.port, timeout=30)
    try:
        connection.request("GET", path, headers=headers)
        response = connection.getresponse()
        return response.status, dict(response.getheaders()), response.read()
    finally:
        connection.close()


def test_gunicorn_answers_health(production):
    status, headers, body = get(production, "/api/health/")
    assert status == 200
    assert json.loads(body) == HEALTHY
    assert headers["Content-Type"] == "application/json"


def test_gunicorn_serves_the_admins_static_files_without_debug(production):
    status, headers, body = get(production, "/static/admin/css/base.css")
    assert status == 200
    assert headers["Content-Type"].startswith("text/css")
    assert b"body" in body


def test_gunicorn_behind_a_tls_proxy_sends_hsts(production):
    _, plain, _ = get(production, "/api/health/")
    assert "Strict-Transport-Security" not in plain
    _, proxied, _ = get(production, "/api/health/", **{"X-Forwarded-Proto": "https"})
    assert proxied["Strict-Transport-Security"] == "max-age=31536000; includeSubDomains"


def test_gunicorn_answers_a_huge_declared_body_at_once_with_threads(production):
    """gthread keeps connections alive: the 413 still comes before the body."""
    with socket.create_connection(("127.0.0.1", production.port), timeout=30) as sock:
        head = (
            "POST /api/tasks/ HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            f"Content-Length: {100 * 2**20}\r\n\r\n"
        )
        sock.sendall(head.encode("ascii") + b'{"title": "')
        response = http.client.HTTPResponse(sock)
        response.begin()
        assert response.status == 413
        assert json.loads(response.read())["code"] == "too_large"


def test_gunicorn_logs_each_request_as_one_json_line(production):
    get(production, "/api/health/?probe=access-log")
    deadline = time.monotonic() + HANG_GUARD_SECONDS
    while True:  # gunicorn writes the line after it sent the answer
        lines = [json.loads(text) for text in production.access_log.read_text().splitlines()]
        requests = [line["request"] for line in lines if line.get("logger") == "gunicorn.access"]
        if requests or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert requests, "no access log line"
    assert all(set(line) == {"time", "level", "logger", "request"} for line in lines)
    health = [request for request in requests if request["path"] == "/api/health/"]
    assert health
    assert set(health[-1]) == {"method", "path", "status", "bytes", "duration_ms", "remote_addr"}
    assert (health[-1]["method"], health[-1]["status"]) == ("GET", 200)
    assert "access-log" not in production.access_log.read_text()


def test_gunicorn_and_django_log_json_lines_on_stderr(production):
    status, _, _ = get(production, "/api/no-such-endpoint/")
    assert status == 404
    wanted = "Not Found: /api/no-such-endpoint/"
    deadline = time.monotonic() + HANG_GUARD_SECONDS
    while True:  # Django logs the 404 as it answers; the line may trail the answer
        lines = [json.loads(text) for text in production.error_log.read_text().splitlines()]
        found = [line for line in lines if line.get("message") == wanted]
        if found:
            break
        assert time.monotonic() < deadline, "no line for the 404"
        time.sleep(0.05)
    assert {"gunicorn.error", "django.request"} <= {line["logger"] for line in lines}
    [line] = found
    assert set(line) == {"time", "level", "logger", "message"}
    assert (line["level"], line["logger"]) == ("WARNING", "django.request")


def test_each_gunicorn_process_has_threads_for_its_event_streams_besides_the_api(monkeypatch):
    import importlib

    from backend import gunicorn_conf

    monkeypatch.setenv("BATON_WEB_THREADS", "8")
    monkeypatch.setenv("BATON_MAX_EVENT_STREAMS", "32")
    assert importlib.reload(gunicorn_conf).threads == 40
    monkeypatch.delenv("BATON_WEB_THREADS")
    monkeypatch.setenv("BATON_MAX_EVENT_STREAMS", "100")
    assert importlib.reload(gunicorn_conf).threads == 108
