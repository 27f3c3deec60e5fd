"""The worker reports a long result value by uploading it first, against the real backend
in-process: the worker's own HTTP client, through Django's WSGI application."""

from __future__ import annotations

import httpx
import pytest
from django.core import signals
from django.core.wsgi import get_wsgi_application
from django.db import close_old_connections

from backend.artifacts.models import Artifact
from backend.tasks.models import Subtask
from backend.tasks.selectors import turn_result
from executors.client import VALUE_UPLOAD_MIN_BYTES, BackendClient, uploads_value
from executors.runner import TurnRun
from tests.dispatch.test_dispatch_api import SINGLE, create
from tests.executors.runs import agno_turn_run

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("pipeline_bots")]


class RecordingTransport(httpx.WSGITransport):
    """Django's WSGI application as the worker's backend, noting each request's method, path
    and body headers."""

    def __init__(self) -> None:
        super().__init__(app=get_wsgi_application())
        self.seen: list[tuple[str, str, str | None, str | None]] = []

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        headers = request.headers
        self.seen.append(
            (
                request.method,
                request.url.path,
                headers.get("content-length"),
                headers.get("transfer-encoding"),
            )
        )
        # As Django's test client does: the request must not close the test's connection,
        # neither when it starts nor when its response is closed.
        signals.request_started.disconnect(close_old_connections)
        signals.request_finished.disconnect(close_old_connections)
        try:
            response = super().handle_request(request)
            content = response.read()
            response.close()
        finally:
            signals.request_started.connect(close_old_connections)
            signals.request_finished.connect(close_old_connections)
        return httpx.Response(response.status_code, headers=response.headers, content=content)


@pytest.fixture
def in_process() -> RecordingTransport:
    return RecordingTransport()


def claimed_run(worker, in_process: RecordingTransport, tmp_path) -> TurnRun:
    from rest_framework.authtoken.models import Token

    client = BackendClient(
        base_url="http://testserver",
        token=Token.objects.get_or_create(user=worker)[0].key,
        worker_id="w1",
        retry_budget_seconds=1.0,
        transport=in_process,
    )
    [turn] = client.dispatch(kinds=["codex"], limit=1).turns
    return agno_turn_run(turn=turn, client=client, root=tmp_path)


def test_a_long_value_is_uploaded_then_named_by_the_report(api, worker, in_process, tmp_path):
    create(api, SINGLE)
    run = claimed_run(worker, in_process, tmp_path)
    value = "".join(f"line {n:07d} of the build log ✓\n" for n in range(40_000))
    assert len(value.encode()) > VALUE_UPLOAD_MIN_BYTES
    in_process.seen.clear()

    run._report(status="COMPLETED", result={"value": value, "commands": ["make"]})

    assert run.reported == "COMPLETED"
    path = f"/api/executor/subtasks/{run.turn.subtask_id}/result/"
    [(upload_method, upload_path, upload_length, chunked), (method, report_path, length, _)] = (
        in_process.seen
    )
    assert (upload_method, upload_path) == ("PUT", f"{path}value/")
    assert (upload_length, chunked) == (str(len(value.encode())), None)
    assert (method, report_path) == ("POST", path)
    assert length is not None and int(length) < 1_000  # the report names the value
    turn = Subtask.objects.select_related("artifact").get(pk=run.turn.subtask_id)
    assert (turn.status, turn.result_value_in_artifact) == ("COMPLETED", True)
    assert turn_result(subtask=turn) == {"value": value, "commands": ["make"]}
    assert Artifact.objects.get() == turn.artifact


def test_a_value_within_the_bound_goes_inside_the_report(api, worker, in_process, tmp_path):
    create(api, SINGLE)
    run = claimed_run(worker, in_process, tmp_path)
    value = "x" * VALUE_UPLOAD_MIN_BYTES
    in_process.seen.clear()

    run._report(status="COMPLETED", result={"value": value})

    assert [(method, path) for method, path, _, _ in in_process.seen] == [
        ("POST", f"/api/executor/subtasks/{run.turn.subtask_id}/result/")
    ]
    assert turn_result(subtask=Subtask.objects.get(pk=run.turn.subtask_id)) == {"value": value}


@pytest.mark.parametrize(
    ("value", "uploaded"),
    [
        ("x" * VALUE_UPLOAD_MIN_BYTES, False),
        ("x" * (VALUE_UPLOAD_MIN_BYTES + 1), True),
        ("é" * (VALUE_UPLOAD_MIN_BYTES // 2), False),
        ("é" * (VALUE_UPLOAD_MIN_BYTES // 2 + 1), True),
        ("x" * VALUE_UPLOAD_MIN_BYTES + "\x00", False),  # NUL: Baton keeps it inline
        ("x" * VALUE_UPLOAD_MIN_BYTES + "\ud800", False),  # a lone surrogate is not UTF-8
        (None, False),
        ({"value": "x" * (2 * VALUE_UPLOAD_MIN_BYTES)}, False),
    ],
    ids=["1 MiB", "1 MiB + 1", "1 MiB of é", "1 MiB of é + 2", "NUL", "surrogate", "null", "dict"],
)
def test_which_values_are_uploaded(value, uploaded) -> None:
    assert uploads_value(value) is uploaded
