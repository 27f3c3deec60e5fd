"""Pages of the lists the API answers.

Tasks and bots are small rows: a page is `page_size` of them (`TaskPagination`). A task's
turns are paged by rows and by bytes (`TurnPagination`), so no page is larger than
BATON_API_PAGE_MAX_BYTES of JSON however many turns it could hold.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.db.models import QuerySet
from rest_framework.pagination import PageNumberPagination
from rest_framework.request import Request
from rest_framework.utils.urls import remove_query_param, replace_query_param

from backend.api.renderers import BatonJSONRenderer
from backend.errors import NotFound
from backend.tasks.models import Subtask

# Rows read from the database at a time while a page fills up.
_FETCH_CHUNK_ROWS = 20


class TaskPagination(PageNumberPagination):
    page_size = 50
    page_size_query_param = "page_size"
    max_page_size = 200


@dataclass(frozen=True)
class TurnPageQuery:
    """Where a page of turns starts (`page`, numbered, or just `after` a message_id, never
    both) and how many turns it may hold."""

    page_size: int
    page: int | None = None
    after: int | None = None


class TurnPagination:
    """A task's turns in message_id order, a page at a time, bounded in rows and in bytes.

    A page starts at row `(page - 1) * page_size` or just after the turn numbered `after`, and
    holds up to `page_size` turns; it stops early, before the turn whose JSON would take the
    page's turns past BATON_API_PAGE_MAX_BYTES, but always holds at least one turn. `next`
    continues just after the page's last turn (`?after=<message_id>`); `previous` is the
    numbered page before a numbered page, null for a page that starts after a turn. A numbered
    page past the last one is a 404. Turns are read `_FETCH_CHUNK_ROWS` rows at a time, so a
    page that stops early has read at most one chunk past its last turn (and a full page one row
    more than it holds, to learn whether another page follows).
    """

    page_size = 100
    max_page_size = 200

    def paginate(
        self,
        turns: QuerySet[Subtask],
        request: Request,
        *,
        query: TurnPageQuery,
        serialize: Callable[[Subtask], dict[str, Any]],
    ) -> dict[str, Any]:
        count = turns.count()
        if query.after is not None:
            rows = turns.filter(message_id__gt=query.after)[: query.page_size + 1]
        else:
            start = ((query.page or 1) - 1) * query.page_size
            rows = turns[start : start + query.page_size + 1]
        renderer = BatonJSONRenderer()
        results: list[dict[str, Any]] = []
        last: Subtask | None = None
        page_bytes = 0
        more = False
        for turn in rows.iterator(chunk_size=_FETCH_CHUNK_ROWS):
            if len(results) == query.page_size:
                more = True
                break
            data = serialize(turn)
            page_bytes += len(renderer.render(data)) + 1  # and its comma
            if results and page_bytes > settings.BATON_API_PAGE_MAX_BYTES:
                more = True
                break
            results.append(data)
            last = turn
        if not results and query.page is not None and query.page > 1:
            raise NotFound(f"Page {query.page} is past the last page of turns.")
        url = request.build_absolute_uri()
        next_url = None
        if more and last is not None:
            after_last = remove_query_param(url, "page")
            next_url = replace_query_param(after_last, "after", last.message_id)
        previous_url = None
        if query.page is not None and query.page > 1:
            previous_url = (
                remove_query_param(url, "page")
                if query.page == 2
                else replace_query_param(url, "page", query.page - 1)
            )
        return {"count": count, "next": next_url, "previous": previous_url, "results": results}
