"""The webhook sender's log holds no byte of a receiver's URL: a real delivery to a receiver
whose URL carries a password, a secret path and a token, under Baton's own logging
configuration (production's JSON lines), with every logger that would print at DEBUG."""

from __future__ import annotations

import copy
import io
import logging
import logging.config
from collections.abc import Iterator

import pytest

from backend.tasks.factories import answered_task
from backend.traffic_logs import TRAFFIC_LOGGERS
from backend.webhooks.sender import deliver_due, http_client
from backend.webhooks.services import create_endpoint

PASSWORD = "hook-password-5f1c"
PATH_SECRET = "path-secret-9a7e"
TOKEN = "query-token-3d2b"
SECRETS = (PASSWORD, PATH_SECRET, TOKEN)


@pytest.fixture
def baton_log_lines(settings, caplog) -> Iterator[io.StringIO]:
    """Baton's LOGGING as configured, its console handler writing JSON lines here; the root at
    DEBUG, and pytest's capture handler on the root beside Baton's."""
    config = copy.deepcopy(settings.LOGGING)
    lines = io.StringIO()
    config["handlers"]["console"].update(formatter="json", stream=lines)
    root = logging.getLogger()
    before = {name: logging.getLogger(name).level for name in TRAFFIC_LOGGERS}
    logging.config.dictConfig(config)
    root.addHandler(caplog.handler)
    root.setLevel(logging.DEBUG)
    try:
        yield lines
    finally:
        logging.config.dictConfig(settings.LOGGING)
        for name, level in before.items():
            logging.getLogger(name).setLevel(level)


def secret_url(receiver_url: str) -> str:
    host = receiver_url.removeprefix("http://").split("/", 1)[0]
    return f"http://hooks:{PASSWORD}@{host}/services/T0/B0/{PATH_SECRET}?token={TOKEN}"


def deliver_one(user, receiver) -> None:
    create_endpoint(owner=user, url=secret_url(receiver.url))
    answered_task(owner=user)
    with http_client() as client:
        assert deliver_due(client=client).delivered == 1
    [request] = receiver.requests  # the secrets did reach the receiver
    assert request.headers["Authorization"].startswith("Basic ")


@pytest.mark.django_db
def test_a_delivery_logs_no_secret_of_its_url(user, receiver, baton_log_lines, caplog):
    deliver_one(user, receiver)
    records = [(record.name, record.getMessage()) for record in caplog.records]
    assert any(name == "baton.events" for name, _ in records)  # the sender did log
    for name, message in records:
        assert not any(secret in message for secret in SECRETS), (name, message)
    assert not any(secret in baton_log_lines.getvalue() for secret in SECRETS)


@pytest.mark.django_db
def test_an_http_library_lowered_to_debug_still_prints_nothing(
    user, receiver, baton_log_lines, caplog
):
    # As if a library, a plugin or an operator's tweak undid the cap on its loggers: the
    # records are made (pytest's handler sees them), and Baton's handlers print none of them.
    for name in TRAFFIC_LOGGERS:
        logging.getLogger(name).setLevel(logging.DEBUG)
    deliver_one(user, receiver)
    traffic = [record for record in caplog.records if record.name.startswith(("httpx", "httpc"))]
    assert any(PASSWORD in record.getMessage() for record in traffic)
    printed = baton_log_lines.getvalue()
    assert '"webhook_attempt"' in printed
    assert not any(secret in printed for secret in SECRETS)
    assert '"logger": "httpx"' not in printed


def test_a_warning_of_an_http_library_keeps_its_level_and_loses_its_text(baton_log_lines, caplog):
    try:
        raise ConnectionError(f"to /services/T0/B0/{PATH_SECRET}")
    except ConnectionError:
        logging.getLogger("urllib3.connectionpool").warning(
            "Retrying (%r) after connection broken by '%r': %s",
            "Retry(total=2)",
            "error",
            f"/services/T0/B0/{PATH_SECRET}?token={TOKEN}",
            exc_info=True,
        )
    printed = baton_log_lines.getvalue()
    assert not any(secret in printed for secret in SECRETS)
    assert '"level": "WARNING", "logger": "urllib3.connectionpool"' in printed
    assert "exception ConnectionError" in printed
