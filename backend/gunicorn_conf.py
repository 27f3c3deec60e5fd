"""gunicorn's configuration for `make serve` (`gunicorn -c python:backend.gunicorn_conf`).

Workers are `gthread`: each process serves `--threads` requests at once, one per thread.
Executor workers poll for turns and heartbeat their claims all the time, and a sync worker
would spend a whole process on each of those connections (and on each slow client); threads
keep them cheap while Baton's views stay plain synchronous Django. gthread keeps connections
alive between requests; a body Baton refused unread (413, `backend.api.body_limits`) is
drained by gunicorn up to 64 KiB and a few seconds, else the connection is closed.

Each process runs BATON_WEB_THREADS threads for requests plus one per task event stream it may
serve (BATON_MAX_EVENT_STREAMS), so listeners never take the threads the rest of the API needs
(a stream beyond the limit is answered 503). `--bind` and `--workers` come from the command line
(the Makefile). Every log line, gunicorn's own and its access log, is one JSON object
(`backend.log_format`).
"""

import os

from backend.traffic_logs import traffic_loggers
from settings.environment import BatonEnvironment

worker_class = "gthread"
threads = int(os.environ.get("BATON_WEB_THREADS", "8")) + int(
    os.environ.get(
        "BATON_MAX_EVENT_STREAMS", BatonEnvironment.model_fields["max_event_streams"].default
    )
)
# Under gthread `timeout` bounds a worker process's silence, not a request: a slow request
# keeps its thread, and the process still checks in.
timeout = 30
# Seconds an idle kept-alive connection waits for its next request (a polling worker's next
# poll comes within about one).
keepalive = 5

logconfig_dict = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"json": {"()": "backend.log_format.JsonLineFormatter"}},
    "filters": {"withhold_traffic_text": {"()": "backend.traffic_logs.WithholdTrafficText"}},
    "handlers": {
        "stdout": {
            "class": "logging.StreamHandler",
            "formatter": "json",
            "stream": "ext://sys.stdout",
            "filters": ["withhold_traffic_text"],
        },
        "stderr": {
            "class": "logging.StreamHandler",
            "formatter": "json",
            "stream": "ext://sys.stderr",
            "filters": ["withhold_traffic_text"],
        },
    },
    # Configuring the access logger turns the access log on, to stdout; Django's LOGGING takes
    # over the root logger once a worker loads the app.
    "root": {"handlers": ["stderr"], "level": "INFO"},
    "loggers": {
        "gunicorn.error": {"handlers": ["stderr"], "level": "INFO", "propagate": False},
        "gunicorn.access": {"handlers": ["stdout"], "level": "INFO", "propagate": False},
        **traffic_loggers("INFO"),
    },
}


def post_worker_init(worker: object) -> None:
    """Each server process derives escaping's tables from Unicode's data and loads the token
    encodings before its first request (`escaping.warm_up`, `units.warm_up`), not inside a
    dispatch: under load, the first requests of a process that loaded them on demand each
    spent 0.6–0.8 s of CPU (`bench/load_profile.py`)."""
    from backend.prompting import escaping, units

    escaping.warm_up()
    units.warm_up()
