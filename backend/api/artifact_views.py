"""The artifact API: metadata, and the whole text or a slice of it, streamed after verification.

`GET /api/artifacts/{id}/content/` answers:
- 200 with the whole text (`text/plain; charset=utf-8`), or with a `?lines=START-END` slice
  (1-based, inclusive; `START-` runs to the last line; the `X-Baton-Lines: START-END/TOTAL`
  header says which lines were sent);
- 206 for a single `Range: bytes=a-b | a- | -n` with `Content-Range`. A malformed Range, several
  ranges, another unit, or an `If-Range` that is not the current ETag are ignored, as RFC 9110
  allows, and the whole text is sent;
- 304 when `If-None-Match` holds the ETag (the quoted sha256, which never changes for an id);
- 400 (field `lines`) for a bad `lines` or for `lines` together with a Range header;
- 404 for an unknown id and for an artifact the caller may not see;
- 416 for a byte range that starts past the end (`Content-Range: bytes */SIZE`) or a `lines`
  slice that starts after the last line;
- 500 with code `artifact_integrity` when the stored content is missing or fails its sha256
  check: a server-side fault that retrying will not fix, so not 503. It is logged with the id and
  no byte of content is sent.
Errors are Baton's JSON error body whatever the request's Accept header says.

A turn's spilled text, `GET /api/tasks/{id}/subtasks/{subtask_id}/text/`, is its artifact's
content served by the same code (`serve_artifact_content`), so it answers exactly as above.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

from django.http import HttpResponseBase, HttpResponseNotModified, StreamingHttpResponse
from django.utils.http import parse_etags
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework import status
from rest_framework.negotiation import BaseContentNegotiation
from rest_framework.parsers import BaseParser
from rest_framework.renderers import BaseRenderer
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from backend.api.artifact_serializers import ArtifactContentQuery, ArtifactOutput
from backend.api.errors import ErrorOutput
from backend.api.permissions import authenticated_user
from backend.api.renderers import BatonJSONRenderer
from backend.artifacts import selectors
from backend.artifacts.models import Artifact
from backend.artifacts.retention import record_artifact_read
from backend.artifacts.selectors import ByteRange, LineRange, RangeNotSatisfiable
from backend.errors import InvalidInput
from backend.tasks.artifact_access import artifact_as_seen_by, visible_artifact

CONTENT_TYPE = "text/plain; charset=utf-8"
_BYTE_RANGE = re.compile(r"^bytes=[ \t]*(\d*)-(\d*)[ \t]*$", re.IGNORECASE)


@dataclass(frozen=True)
class _RequestedRange:
    """One syntactically valid byte-range-spec: `first-last`, `first-`, or the suffix `-last`."""

    first: int | None
    last: int | None

    def resolve(self, *, size: int) -> ByteRange | None:
        """The slice to send, or None when the range cannot be satisfied (416)."""
        if self.first is None:  # the last `self.last` bytes
            assert self.last is not None  # `_requested_range` refuses a range without either end
            if self.last == 0 or size == 0:
                return None
            return ByteRange(start=max(0, size - self.last), end=size)
        if self.first >= size:
            return None
        end = size if self.last is None else min(self.last + 1, size)
        return ByteRange(start=self.first, end=end)


def _requested_range(request: Request, *, etag: str) -> _RequestedRange | None:
    """The single byte range asked for, or None when there is none Baton will honour."""
    header = request.headers.get("Range")
    if header is None:
        return None
    if_range = request.headers.get("If-Range")
    if if_range is not None and if_range.strip() != etag:
        return None  # the client's copy is not this content: send it whole
    match = _BYTE_RANGE.match(header.strip())
    if match is None:
        return None
    first = int(match.group(1)) if match.group(1) else None
    last = int(match.group(2)) if match.group(2) else None
    if first is None and last is None:
        return None
    if first is not None and last is not None and last < first:
        return None
    return _RequestedRange(first=first, last=last)


def _etag_matches(header: str | None, *, etag: str) -> bool:
    """If-None-Match uses the weak comparison: `W/"x"` matches `"x"`."""
    if not header:
        return False
    tags = parse_etags(header)
    return "*" in tags or etag in (tag.removeprefix("W/") for tag in tags)


class JSONErrorsNegotiation(BaseContentNegotiation):
    """Always pick the JSON renderer: content bypasses rendering, and errors are always JSON.

    Without this, a client sending `Accept: text/plain` would get 406 before the view runs.
    """

    def select_parser(self, request: Request, parsers: Iterable[BaseParser]) -> BaseParser | None:
        return next(iter(parsers), None)

    def select_renderer(
        self, request: Request, renderers: Iterable[BaseRenderer], format_suffix: str | None = None
    ) -> tuple[BaseRenderer, str]:
        renderer = next(iter(renderers))
        return renderer, renderer.media_type


class ArtifactDetailApi(APIView):
    @extend_schema(
        operation_id="artifacts_retrieve",
        responses={200: ArtifactOutput, 404: ErrorOutput},
        summary="An artifact's metadata: sizes, kind, sha256, workspace path and download URL",
    )
    def get(self, request: Request, artifact_id: str) -> Response:
        user = authenticated_user(request)
        artifact = artifact_as_seen_by(
            user=user, artifact=visible_artifact(user=user, artifact_id=artifact_id)
        )
        return Response(ArtifactOutput(artifact, context={"request": request}).data)


_TEXT = OpenApiTypes.STR


class ArtifactContentApi(APIView):
    renderer_classes = [BatonJSONRenderer]
    content_negotiation_class = JSONErrorsNegotiation

    @extend_schema(
        operation_id="artifacts_content",
        summary="An artifact's text, whole or sliced by a byte Range or ?lines=START-END",
        description=__doc__,
        parameters=[
            ArtifactContentQuery,
            OpenApiParameter(
                "Range",
                str,
                OpenApiParameter.HEADER,
                required=False,
                description="One byte range: bytes=a-b, bytes=a- or bytes=-n.",
            ),
            OpenApiParameter(
                "If-Range",
                str,
                OpenApiParameter.HEADER,
                required=False,
                description="Honour Range only when this is the current ETag.",
            ),
            OpenApiParameter(
                "If-None-Match",
                str,
                OpenApiParameter.HEADER,
                required=False,
                description="The ETag you hold; 304 when it is current.",
            ),
        ],
        responses={
            (200, "text/plain"): OpenApiResponse(_TEXT, description="The text or a line slice."),
            (206, "text/plain"): OpenApiResponse(_TEXT, description="The requested byte range."),
            304: OpenApiResponse(description="Not modified."),
            (400, "application/json"): ErrorOutput,
            (404, "application/json"): ErrorOutput,
            (416, "application/json"): ErrorOutput,
            (500, "application/json"): OpenApiResponse(
                ErrorOutput, description="Stored content missing or failing its sha256 check."
            ),
        },
    )
    def get(self, request: Request, artifact_id: str) -> HttpResponseBase:
        query = ArtifactContentQuery(data=request.query_params.dict())
        query.is_valid(raise_exception=True)
        artifact = visible_artifact(user=authenticated_user(request), artifact_id=artifact_id)
        return serve_artifact_content(
            request, artifact=artifact, line_range=query.validated_data.get("lines")
        )


def serve_artifact_content(
    request: Request, *, artifact: Artifact, line_range: LineRange | None
) -> HttpResponseBase:
    """The answer to a GET of the artifact's content, as the module docstring describes it.

    The caller has validated the query and decided that this caller may read the artifact;
    every endpoint that serves stored text whole (this one, a turn's text) answers through
    here, so they share caching, ranges, line slices and the integrity check.
    """
    etag = f'"{artifact.sha256}"'

    if _etag_matches(request.headers.get("If-None-Match"), etag=etag):
        # The client still uses its copy: that counts as a read for retention.
        record_artifact_read(artifact_id=artifact.id)
        not_modified = HttpResponseNotModified()
        not_modified["ETag"] = etag
        return not_modified

    requested = _requested_range(request, etag=etag)
    if requested is not None and line_range is not None:
        raise InvalidInput("Give either a Range header or ?lines=, not both.", field="lines")
    byte_range = None
    if requested is not None:
        byte_range = requested.resolve(size=artifact.size_bytes)
        if byte_range is None:
            raise RangeNotSatisfiable(
                f"Range {request.headers['Range']!r} cannot be satisfied: artifact "
                f"{artifact.id} has {artifact.size_bytes} bytes.",
                size_bytes=artifact.size_bytes,
            )

    # Raises ArtifactIntegrityError (500) or LinesNotSatisfiable (416), mapped by
    # backend.api.errors like every other error.
    content = selectors.artifact_content(
        artifact=artifact, byte_range=byte_range, line_range=line_range
    )
    record_artifact_read(artifact_id=artifact.id)

    # Closing the response closes `content` and its stored file, whether or not the body
    # was ever iterated (a client may drop the connection before the first byte).
    response = StreamingHttpResponse(
        content,
        status=status.HTTP_206_PARTIAL_CONTENT if byte_range else status.HTTP_200_OK,
        content_type=CONTENT_TYPE,
    )
    response["Content-Length"] = str(content.length)
    response["ETag"] = etag
    response["Accept-Ranges"] = "bytes"
    response["Cache-Control"] = "private"
    if byte_range is not None:
        response["Content-Range"] = f"bytes {content.start}-{content.end - 1}/{content.size_bytes}"
    if content.lines is not None:
        response["X-Baton-Lines"] = (
            f"{content.lines.start}-{content.lines.end}/{content.total_lines}"
        )
    return response
