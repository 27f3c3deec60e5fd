"""The health endpoint: can this server reach its database and its artifact storage?

`GET /api/health/` needs no account and says nothing but which part works: 200
`{"status": "ok", "database": "ok", "artifacts": "ok"}`, or 503 with `"status": "unavailable"`
and `"failed"` for each part that failed. The database answers a one-row query; the artifact
storage takes a tiny write, serves it back and deletes it (`probe_storage`), so a read-only or
full store fails too. A failure is logged as the `health_check_failed` event with the part and
the exception's type, never its text (it may name paths or quote a backend's answer). The
endpoint is exempt from the HTTPS redirect, so a load balancer can probe the server directly.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from drf_spectacular.utils import extend_schema, inline_serializer
from rest_framework import serializers, status
from rest_framework.permissions import AllowAny
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from backend.artifacts.storage import probe_storage
from backend.dispatch.models import ConfigurationVersion
from backend.events import log_event, opaque_id

OK = "ok"
FAILED = "failed"


def _probe_database() -> None:
    # The smallest query the ORM builds, on a table every migrated database has (one row).
    ConfigurationVersion.objects.filter(pk=1).exists()


CHECKS: dict[str, Callable[[], None]] = {
    "database": _probe_database,
    "artifacts": probe_storage,
}


def _check(part: str, probe: Callable[[], None]) -> str:
    try:
        probe()
    except Exception as error:  # noqa: BLE001 - any backend's failure means the part is down
        log_event(
            "health_check_failed",
            level=logging.ERROR,
            part=part,
            error_type=opaque_id(type(error).__name__),
        )
        return FAILED
    return OK


HEALTH_OUTPUT = inline_serializer(
    "HealthOutput",
    {
        "status": serializers.ChoiceField(choices=["ok", "unavailable"]),
        **{part: serializers.ChoiceField(choices=[OK, FAILED]) for part in CHECKS},
    },
)


class HealthApi(APIView):
    # No authentication at all: a probe sends no credentials, and a stale one must not 401.
    authentication_classes: list[type] = []
    permission_classes = [AllowAny]

    @extend_schema(
        summary="Whether the database and the artifact storage work",
        responses={200: HEALTH_OUTPUT, 503: HEALTH_OUTPUT},
    )
    def get(self, request: Request) -> Response:
        parts = {part: _check(part, probe) for part, probe in CHECKS.items()}
        healthy = all(result == OK for result in parts.values())
        return Response(
            {"status": "ok" if healthy else "unavailable", **parts},
            status=status.HTTP_200_OK if healthy else status.HTTP_503_SERVICE_UNAVAILABLE,
            headers={"Cache-Control": "no-store"},
        )
