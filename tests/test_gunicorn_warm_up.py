"""A server process derives escaping's tables and loads the token encodings before its first
request, not inside a dispatch."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

from backend import gunicorn_conf
from backend.prompting import escaping, units


def test_each_server_process_warms_escaping_before_its_first_request() -> None:
    derived = (
        escaping._derived_classes,
        escaping._candidates,
        escaping._marker_prefilter,
        escaping._looks_structural_folded,
        escaping._folded_marker,
        escaping._brackets,
        escaping.colon_like_class,
    )
    for table in derived:
        table.cache_clear()
    gunicorn_conf.post_worker_init(object())
    assert [table.cache_info().currsize for table in derived] == [1] * len(derived)


def test_each_server_process_loads_the_token_encodings_before_its_first_request() -> None:
    units._loaded_encoding.cache_clear()
    gunicorn_conf.post_worker_init(object())
    assert units._loaded_encoding.cache_info().currsize == len(units.ENCODINGS)


def test_threads_asking_for_an_encoding_at_once_share_one_load() -> None:
    units._loaded_encoding.cache_clear()
    with ThreadPoolExecutor(max_workers=8) as pool:
        loaded = list(pool.map(units.load_encoding, [units.O200K_ENCODING] * 8))
    assert all(encoding is loaded[0] for encoding in loaded)
    assert units._loaded_encoding.cache_info().misses == 1
