"""JSON log lines: exact keys for each kind of record, and never an exception's text."""

from __future__ import annotations

import json
import logging
import sys

from django.http import HttpRequest, HttpResponse
from django.urls import path

from backend.events import log_event
from backend.log_format import JsonLineFormatter

SECRET = "the launch code is 0000"


def formatted(record: logging.LogRecord) -> dict[str, object]:
    line = JsonLineFormatter().format(record)
    assert "\n" not in line
    return json.loads(line)


def make_record(name: str, message: str, args: tuple[object, ...] | None = None):
    return logging.LogRecord(name, logging.WARNING, __file__, 1, message, args, None)


def test_a_record_is_time_level_logger_and_message():
    record = make_record("django.request", "Not Found: %s", ("/api/nothing/",))
    record.created = 1_800_000_000.25
    assert formatted(record) == {
        "time": "2027-01-15T08:00:00.250+00:00",
        "level": "WARNING",
        "logger": "django.request",
        "message": "Not Found: /api/nothing/",
    }


def test_an_event_keeps_its_name_and_fields_as_json(caplog):
    with caplog.at_level(logging.INFO, logger="baton.events"):
        log_event("turn_claimed", task=7, worker="worker-1", spilled=False)
    [record] = caplog.records
    line = formatted(record)
    assert set(line) == {"time", "level", "logger", "event", "fields"}
    assert (line["level"], line["logger"], line["event"]) == (
        "INFO",
        "baton.events",
        "turn_claimed",
    )
    assert line["fields"] == {"task": 7, "worker": "worker-1", "spilled": False}


def test_a_gunicorn_access_line_names_its_fields_and_drops_the_query():
    atoms = {"m": "GET", "U": "/api/tasks/", "q": "secret=1", "s": "200", "B": 48}
    atoms |= {"D": 1500, "h": "10.0.0.1", "r": "GET /api/tasks/?secret=1 HTTP/1.1"}
    record = make_record("gunicorn.access", '%(h)s "%(r)s" %(s)s', None)
    record.args = atoms  # as gunicorn logs it: the atoms are the format's mapping
    line = formatted(record)
    assert set(line) == {"time", "level", "logger", "request"}
    assert line["request"] == {
        "method": "GET",
        "path": "/api/tasks/",
        "status": 200,
        "bytes": 48,
        "duration_ms": 1.5,
        "remote_addr": "10.0.0.1",
    }


def test_an_exception_gives_its_type_and_frames_never_its_text():
    try:
        raise ValueError(SECRET)
    except ValueError:
        record = make_record("django.request", "Internal Server Error: %s", ("/boom/",))
        record.exc_info = sys.exc_info()
    line = formatted(record)
    assert SECRET not in json.dumps(line)
    exception = line["exception"]
    assert isinstance(exception, dict)
    assert exception["type"] == "ValueError"
    [frame] = exception["frames"]
    assert frame.endswith("in test_an_exception_gives_its_type_and_frames_never_its_text")


# --- a 500 outside the API, logged by Django with the exception ---------------------------------


def fail_with_the_body(request: HttpRequest) -> HttpResponse:
    raise ValueError(request.body.decode())


urlpatterns = [path("boom/", fail_with_the_body)]


def test_a_500s_log_line_holds_no_request_body(client, settings, caplog):
    settings.ROOT_URLCONF = __name__
    client.raise_request_exception = False
    with caplog.at_level(logging.INFO):
        response = client.post("/boom/", data=SECRET, content_type="text/plain")
    assert response.status_code == 500
    [record] = [record for record in caplog.records if record.name == "django.request"]
    assert SECRET in str(record.exc_info[1])  # Django hands the formatter the exception...
    line = formatted(record)
    assert SECRET not in json.dumps(line)  # ...and the line leaves its text out
    assert line["message"] == "Internal Server Error: /boom/"
    assert line["level"] == "ERROR"
    assert line["exception"]["type"] == "ValueError"
