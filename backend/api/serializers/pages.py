"""The OpenAPI shape of a list paged by `TaskPagination`."""

from __future__ import annotations

from typing import Any

from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, inline_serializer
from rest_framework import serializers

from backend.api.pagination import TaskPagination

# The query parameters of a list paged by `TaskPagination` whose view reads no other.
PAGE_PARAMETERS = [
    OpenApiParameter(
        "page", OpenApiTypes.INT, description="The page, from 1; one past the last is a 404."
    ),
    OpenApiParameter(
        "page_size",
        OpenApiTypes.INT,
        description=f"Rows per page (default {TaskPagination.page_size}, at most "
        f"{TaskPagination.max_page_size}).",
    ),
]


def page_of(output: type[serializers.Serializer[Any]]) -> serializers.Serializer[Any]:
    """The schema of a page of `output` rows, as `TaskPagination` answers a list."""
    return inline_serializer(
        name=f"Paginated{output.__name__}List",
        fields={
            "count": serializers.IntegerField(help_text="The rows of all pages together."),
            "next": serializers.URLField(allow_null=True, help_text="The next page, if any."),
            "previous": serializers.URLField(allow_null=True, help_text="The page before, if any."),
            "results": output(many=True),
        },
    )
