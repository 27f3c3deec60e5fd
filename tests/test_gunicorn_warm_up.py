"""A server process derives escaping's tables before its first request, not inside a dispatch."""

from __future__ import annotations

from backend import gunicorn_conf
from backend.prompting import escaping


def test_each_server_process_warms_escaping_before_its_first_request() -> None:
    escaping._candidates.cache_clear()
    escaping._marker_prefilters.cache_clear()
    escaping._derived_classes.cache_clear()
    gunicorn_conf.post_worker_init(object())
    assert escaping._derived_classes.cache_info().currsize == 1
    assert escaping._candidates.cache_info().currsize == 1
    assert escaping._marker_prefilters.cache_info().currsize == 1
