"""The schema endpoint answers requests that arrive together: drf-spectacular's generator keeps
process-wide state while it runs, so `SchemaApi` generates one schema at a time."""

from __future__ import annotations

import threading

from django.test import Client

REQUESTS = 6


def test_schema_requests_at_once_all_get_the_schema():
    start = threading.Barrier(REQUESTS)
    answers: list[tuple[int, int]] = []

    def ask() -> None:
        client = Client(raise_request_exception=False)
        start.wait()
        for _ in range(3):
            answer = client.get("/api/schema/", HTTP_ACCEPT="application/vnd.oai.openapi+json")
            answers.append((answer.status_code, len(answer.content)))

    threads = [threading.Thread(target=ask) for _ in range(REQUESTS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert len(answers) == REQUESTS * 3
    assert {status for status, _ in answers} == {200}
    assert len({size for _, size in answers}) == 1  # the same schema every time
