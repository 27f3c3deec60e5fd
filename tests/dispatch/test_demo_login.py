"""The demo login: kept in var/demo-login, and printed again once the server answers.

`make run` runs `seed_demo --login-when-up` beside the server, so the admin's password and the
API token are the last thing on the console once the server is up. The server here is a
loopback stand-in whose health check answers 503 (a database still down) before 200.
"""

from __future__ import annotations

import io
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

pytestmark = pytest.mark.django_db


def run(*args: str) -> str:
    out = io.StringIO()
    call_command(*args, stdout=out)
    return out.getvalue()


class _Health(BaseHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:
        pass

    def do_GET(self) -> None:  # noqa: N802 - http.server's naming
        statuses = self.server.statuses  # type: ignore[attr-defined]
        self.server.seen.append(self.path)  # type: ignore[attr-defined]
        self.send_response(statuses.pop(0) if statuses else 200)
        self.send_header("Content-Length", "0")
        self.end_headers()


def test_the_login_is_kept_and_printed_again_once_the_server_answers(settings, tmp_path):
    settings.VAR_DIR = tmp_path
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Health)
    server.statuses, server.seen = [503, 503], []  # type: ignore[attr-defined]
    threading.Thread(target=server.serve_forever, daemon=True).start()
    base_url = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        printed = run("seed_demo", "--base-url", base_url)
        kept = tmp_path / "demo-login"
        assert kept.read_text(encoding="utf-8") == printed
        assert kept.stat().st_mode & 0o777 == 0o600  # it holds a password and two tokens
        assert "Kept in:" in printed
        again = run("seed_demo", "--base-url", base_url, "--login-when-up")
    finally:
        server.shutdown()
        server.server_close()
    assert again == printed
    assert server.seen == ["/api/health/"] * 3  # type: ignore[attr-defined]


def test_make_runs_quiet_load_prints_nothing_and_keeps_the_login(settings, tmp_path):
    """`make run` loads the demo with --verbosity 0: the login is printed once, when the
    server is up (above), not also before it."""
    settings.VAR_DIR = tmp_path
    assert run("seed_demo", "--verbosity", "0") == ""
    assert "Kept in:" in (tmp_path / "demo-login").read_text(encoding="utf-8")


def test_waiting_for_a_login_never_kept_is_an_error(settings, tmp_path):
    settings.VAR_DIR = tmp_path
    with pytest.raises(CommandError, match="run manage.py seed_demo first"):
        run("seed_demo", "--login-when-up")
