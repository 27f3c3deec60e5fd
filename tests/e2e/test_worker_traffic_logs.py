"""The worker's log holds no byte of the backend's URL beyond its host, at DEBUG: a real turn
through the real worker (`python -m executors`, its HTTP client `executors.client`) against
Baton served under a secret path prefix, as behind a gateway. (A password in the URL's user
info would replace the worker's token; a query string cannot prefix the API's paths.)"""

from __future__ import annotations

import io
import logging
from collections.abc import Iterator

import httpx
import pytest
from django.urls import include, path

from executors.logs import configure_logging
from tests.e2e.live import Baton, worker

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("shipped_bots"),
]

PATH_SECRET = "gateway-secret-7c41"
urlpatterns = [path(f"{PATH_SECRET}/", include("backend.urls"))]


@pytest.fixture
def baton_behind_a_secret_path(baton, settings) -> Iterator[Baton]:
    settings.ROOT_URLCONF = __name__
    url = f"{baton.url}/{PATH_SECRET}"
    with httpx.Client(base_url=url, headers=baton.product.headers, timeout=30) as product:
        yield Baton(url=url, product=product, worker_token=baton.worker_token)


def test_a_worker_turn_logs_no_secret_of_the_backend_url(
    baton_behind_a_secret_path, model_server, tmp_path
):
    baton = baton_behind_a_secret_path
    model_server.set_turns([{"text": "Done."}])
    with worker(baton, model_server, tmp_path, ["codex"], BATON_LOG_LEVEL="DEBUG") as running:
        task = baton.create(executor="codex", message="Say done.")
        assert baton.wait(task["id"])["turns"][-1]["status"] == "COMPLETED"
    logs = running.logs()
    assert "DEBUG" in logs or "INFO" in logs  # the worker logged, at DEBUG
    assert baton.worker_token not in logs
    assert PATH_SECRET not in logs, [line for line in logs.splitlines() if PATH_SECRET in line]


def test_the_worker_prints_no_request_line_even_with_httpx_at_debug():
    # As if a library undid the cap: the records are made, the worker's handler prints none.
    root = logging.getLogger()
    saved = (root.handlers[:], root.level)
    root.handlers = []
    try:
        configure_logging("DEBUG")
        [handler] = root.handlers
        lines = io.StringIO()
        handler.setStream(lines)  # type: ignore[attr-defined]
        logging.getLogger("httpx").setLevel(logging.DEBUG)
        url = f"http://127.0.0.1:8000/{PATH_SECRET}/api/executor/dispatch/"
        logging.getLogger("httpx").info('HTTP Request: POST %s "HTTP/1.1 200 OK"', url)
        logging.getLogger("httpcore.connection").warning("failed on %s", url)
        logging.getLogger("baton.worker").info("worker line")
    finally:
        root.handlers, root.level = saved
        logging.getLogger("httpx").setLevel(logging.WARNING)
    printed = lines.getvalue()
    assert PATH_SECRET not in printed
    assert "baton.worker worker line" in printed
    assert "WARNING httpcore.connection httpcore.connection logged a WARNING record" in printed
