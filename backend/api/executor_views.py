"""The executor API: workers claim turns, keep their lease alive, stream progress, report."""

from __future__ import annotations

import io
from collections.abc import Callable, Mapping
from typing import Any

from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework import serializers
from rest_framework.exceptions import UnsupportedMediaType
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from backend.api import body_limits
from backend.api.client_connection import client_still_connected
from backend.api.executor_serializers import (
    ClaimInput,
    ClaimQuery,
    DispatchInput,
    DispatchOutput,
    HeartbeatInput,
    HeartbeatOutput,
    LeaseOutput,
    ProgressConflictOutput,
    ProgressInput,
    ProgressOutput,
    ResultInput,
    ResultOutput,
    ValueUploadOutput,
    steer_results,
)
from backend.api.links import artifact_download_urls
from backend.api.permissions import IsExecutorWorker, authenticated_user
from backend.api.schema import STORE_FAILED, error_response
from backend.artifacts.selectors import ManifestEntry, ManifestPart
from backend.dispatch import claims, leases, reports, waiting
from backend.dispatch.payload import ClaimedTurn
from backend.tasks.models import Subtask, SubtaskKind

# How DRF writes a datetime (the API's one format).
_DATETIME = serializers.DateTimeField()


def _turn_payload(
    turn: ClaimedTurn, *, heartbeat_interval: int, download_url: Callable[[str], str]
) -> dict[str, Any]:
    """The turn as `DispatchedTurnOutput` describes it, built as plain data: a manifest lists a
    file per earlier turn, and a serializer per entry costs more than the rest of the answer
    (tests check the two agree)."""
    subtask = turn.subtask
    return {
        "task_id": turn.task.pk,
        "subtask_id": subtask.pk,
        "kind": subtask.kind,
        "summary": (
            {
                "first_message_id": subtask.summary_first_message_id,
                "last_message_id": subtask.summary_last_message_id,
            }
            if subtask.kind == SubtaskKind.SUMMARY
            else None
        ),
        "message_id": subtask.message_id,
        "attempt": subtask.attempts,
        "task_type": turn.task.task_type,
        "executor": subtask.executor,
        "bot": subtask.bot,
        "bot_config": _bot_config(turn),
        "prompt": turn.prompt.build.text,
        "prompt_report": turn.prompt.build.report.to_dict(),
        "artifacts": [_entry(entry, download_url=download_url) for entry in turn.manifest],
        "artifact_lists": [
            _part(listed, download_url=download_url) for listed in turn.artifact_lists
        ],
        "artifact_url_template": download_url("{id}"),
        "manifest_version": (
            2 if turn.artifact_lists or any(entry.parts for entry in turn.manifest) else 1
        ),
        "native_session_id": turn.session.session_id if turn.session else "",
        "native_session": (
            {
                "id": turn.session.session_id,
                "worker_id": turn.session.worker_id,
                "seen_through_message_id": turn.session.seen_through_message_id,
            }
            if turn.session
            else None
        ),
        "resume_prompt": turn.resume.build.text if turn.resume else None,
        "resume_prompt_report": turn.resume.build.report.to_dict() if turn.resume else None,
        "resume_reason": turn.resume_reason,
        "lease_expires_at": (
            _DATETIME.to_representation(subtask.lease_expires_at)
            if subtask.lease_expires_at is not None
            else None
        ),
        "heartbeat_interval_seconds": heartbeat_interval,
    }


def _bot_config(turn: ClaimedTurn) -> dict[str, Any]:
    """What the executor runs the turn with: its bot's settings, window and place in line."""
    subtask, bot = turn.subtask, turn.bot
    return {
        "bot": subtask.bot,
        "executor": subtask.executor,
        "model": bot.model,
        "instructions": bot.instructions,
        "permission_mode": bot.permission_mode,
        "max_turns": bot.max_turns,
        "timeout_seconds": bot.timeout_seconds,
        # The bot's own window, else the model table's (None when neither is known).
        "context_window": turn.prompt.budget.context_window,
        "context_passing": turn.prompt.context_passing,
        "pipeline_step": subtask.pipeline_step or 0,
        "pipeline_length": len(turn.task.pipeline) if subtask.kind == SubtaskKind.TURN else 1,
    }


def _entry(entry: ManifestEntry, *, download_url: Callable[[str], str]) -> dict[str, Any]:
    return {
        "id": entry.id,
        "sha256": entry.sha256,
        "kind": entry.kind,
        "size_bytes": entry.size_bytes,
        "size_chars": entry.size_chars,
        "size_lines": entry.size_lines,
        "path": entry.workspace_path,
        "download_url": download_url(entry.id),
        "parts": (
            [_part(part, download_url=download_url) for part in entry.parts]
            if entry.parts is not None
            else None
        ),
    }


def _part(part: ManifestPart, *, download_url: Callable[[str], str]) -> dict[str, Any]:
    return {
        "id": part.id,
        "sha256": part.sha256,
        "size_bytes": part.size_bytes,
        "download_url": download_url(part.id),
    }


def _lease(subtask: Subtask) -> dict[str, Any]:
    return {
        "subtask_id": subtask.pk,
        "status": subtask.status,
        "attempt": subtask.attempts,
        "lease_expires_at": subtask.lease_expires_at,
    }


# What a report about a turn answers when its claim is not the one running the turn.
CLAIM_REFUSED = error_response(
    "The claim lost its lease (code `lease_lost`), or the turn is not in a state that takes "
    "this report (it was cancelled, or already has another result)."
)


class ExecutorApi(APIView):
    permission_classes = [IsExecutorWorker]


class DispatchApi(ExecutorApi):
    @extend_schema(
        operation_id="executor_dispatch",
        request=DispatchInput,
        responses=DispatchOutput,
        summary="Claim pending assistant turns and receive their prompts",
    )
    def post(self, request: Request) -> Response:
        payload = DispatchInput(data=request.data)
        payload.is_valid(raise_exception=True)
        data = payload.validated_data
        claimed = waiting.claim_or_wait(
            worker=authenticated_user(request),
            worker_id=data["worker_id"],
            kinds=data["kinds"],
            limit=data["limit"],
            wait_seconds=data["wait_seconds"],
            # A worker that stopped while its dispatch waited gets nothing claimed for it.
            still_connected=client_still_connected(request),
        )
        interval = leases.heartbeat_interval_seconds()
        urls = artifact_download_urls(request=request)
        turns = [
            _turn_payload(turn, heartbeat_interval=interval, download_url=urls) for turn in claimed
        ]
        next_ready = (
            None
            if turns
            else claims.next_ready_in_seconds(kinds=data["kinds"], worker_id=data["worker_id"])
        )
        return Response(
            {
                "turns": turns,
                "next_ready_in_seconds": None if next_ready is None else float(next_ready),
            }
        )


class HeartbeatBatchApi(ExecutorApi):
    body_limit = body_limits.HEARTBEAT

    @extend_schema(
        operation_id="executor_heartbeat_batch",
        request=HeartbeatInput,
        responses=HeartbeatOutput,
        summary=(
            "Extend every lease a worker holds, store its turns' progress and learn which "
            "turns were cancelled"
        ),
    )
    def post(self, request: Request) -> Response:
        payload = HeartbeatInput(data=request.data)
        payload.is_valid(raise_exception=True)
        data = payload.validated_data
        worker = authenticated_user(request)
        reports.settle_claims_steers(
            worker=worker,
            worker_id=data["worker_id"],
            results={
                (turn["subtask_id"], turn["attempt"]): steer_results(turn["steers"])
                for turn in data["turns"]
                if turn["steers"]
            },
        )
        progress = reports.record_claims_progress(
            worker=worker,
            worker_id=data["worker_id"],
            reports={
                (turn["subtask_id"], turn["attempt"]): reports.ProgressReport(
                    events=turn["progress"]["events"],
                    partial_text=turn["progress"].get("partial_text"),
                    partial_text_append=turn["progress"].get("partial_text_append"),
                    partial_text_offset=turn["progress"].get("partial_text_offset"),
                )
                for turn in data["turns"]
                if "progress" in turn
            },
        )
        progress.update(
            {
                (turn["subtask_id"], turn["attempt"]): reports.ProgressOutcome(
                    stored=False, code="invalid", detail=turn["progress_refused"]
                )
                for turn in data["turns"]
                if "progress_refused" in turn
            }
        )
        states = reports.heartbeat_claims(
            worker=worker,
            worker_id=data["worker_id"],
            claims=[(turn["subtask_id"], turn["attempt"]) for turn in data["turns"]],
        )
        return Response(heartbeat_answer(states, progress))


def heartbeat_answer(
    states: list[leases.LeaseState],
    progress: Mapping[tuple[int, int], reports.ProgressOutcome] | None = None,
) -> dict[str, Any]:
    """`HeartbeatOutput`'s representation of the claims' states and of what became of the
    progress they carried, written out as the dispatch's payload is: a worker sends a
    heartbeat twice a second for up to 100 claims, and DRF's serializer spent about a quarter
    of such a request representing them."""
    progress = progress or {}
    turns = []
    for state in states:
        turn: dict[str, Any] = {
            "subtask_id": state.subtask_id,
            "attempt": state.attempt,
            "state": state.state,
            "lease_expires_at": None
            if state.lease_expires_at is None
            else _DATETIME.to_representation(state.lease_expires_at),
        }
        if state.steers:
            turn["steers"] = [
                {"steer_id": offer.steer_id, "message": offer.message} for offer in state.steers
            ]
        outcome = progress.get((state.subtask_id, state.attempt))
        if outcome is not None:
            turn["progress"] = {
                "stored": outcome.stored,
                "partial_text_chars": outcome.partial_text_chars,
                "code": outcome.code,
                "detail": outcome.detail,
            }
        turns.append(turn)
    return {"turns": turns, "heartbeat_interval_seconds": leases.heartbeat_interval_seconds()}


class HeartbeatApi(ExecutorApi):
    @extend_schema(
        operation_id="executor_heartbeat",
        request=ClaimInput,
        responses={200: LeaseOutput, 409: CLAIM_REFUSED},
    )
    def post(self, request: Request, subtask_id: int) -> Response:
        payload = ClaimInput(data=request.data)
        payload.is_valid(raise_exception=True)
        subtask = reports.heartbeat(
            worker=authenticated_user(request), subtask_id=subtask_id, **payload.validated_data
        )
        return Response(LeaseOutput(_lease(subtask)).data)


class StoppedApi(ExecutorApi):
    @extend_schema(
        operation_id="executor_stopped",
        request=ClaimInput,
        responses={200: LeaseOutput, 409: CLAIM_REFUSED},
        summary="Confirm that a stopped turn's executor and its processes are gone",
    )
    def post(self, request: Request, subtask_id: int) -> Response:
        payload = ClaimInput(data=request.data)
        payload.is_valid(raise_exception=True)
        subtask = reports.confirm_stopped(
            worker=authenticated_user(request), subtask_id=subtask_id, **payload.validated_data
        )
        return Response(LeaseOutput(_lease(subtask)).data)


class ProgressApi(ExecutorApi):
    body_limit = body_limits.PROGRESS

    @extend_schema(
        operation_id="executor_progress",
        request=ProgressInput,
        responses={
            200: ProgressOutput,
            409: OpenApiResponse(
                ProgressConflictOutput,
                description=(
                    "The claim lost its lease (`lease_lost`) or its turn was cancelled "
                    "(`cancelled`); or `partial_text_offset` is not the stored partial text's "
                    "length (`partial_text_mismatch`, with `partial_text_chars`): send the "
                    "whole text as partial_text."
                ),
            ),
        },
    )
    def post(self, request: Request, subtask_id: int) -> Response:
        payload = ProgressInput(data=request.data)
        payload.is_valid(raise_exception=True)
        data = payload.validated_data
        subtask = reports.record_progress(
            worker=authenticated_user(request),
            worker_id=data["worker_id"],
            attempt=data["attempt"],
            subtask_id=subtask_id,
            events=data["events"],
            partial_text=data.get("partial_text"),
            partial_text_append=data.get("partial_text_append"),
            partial_text_offset=data.get("partial_text_offset"),
        )
        return Response(
            ProgressOutput(
                {**_lease(subtask), "partial_text_chars": subtask.partial_text_chars}
            ).data
        )


class ResultApi(ExecutorApi):
    body_limit = body_limits.RESULT

    @extend_schema(
        operation_id="executor_result",
        request=ResultInput,
        responses={200: ResultOutput, 409: CLAIM_REFUSED, 503: STORE_FAILED},
    )
    def post(self, request: Request, subtask_id: int) -> Response:
        payload = ResultInput(data=request.data)
        payload.is_valid(raise_exception=True)
        data = payload.validated_data
        subtask, changed = reports.report_result(
            worker=authenticated_user(request),
            worker_id=data["worker_id"],
            attempt=data["attempt"],
            subtask_id=subtask_id,
            status=data["status"],
            result=data["result"],
            error=data["error"],
            error_code=data["error_code"],
            usage=data["usage"],
            native_session_id=data["native_session_id"],
            session_resumed=data["session_resumed"],
            value_upload=data["value_upload"],
            steers=steer_results(data["steers"]),
        )
        return Response(ResultOutput({**_lease(subtask), "changed": changed}).data)


class ResultValueApi(ExecutorApi):
    """A result's value on its own, as raw UTF-8, for a value too long to send inside the JSON
    report: read in chunks from the request stream, never whole (`reports.upload_result_value`).
    The claim is named in the query string, since the body is the value."""

    body_limit = body_limits.RESULT_VALUE

    @extend_schema(
        operation_id="executor_result_value",
        parameters=[
            OpenApiParameter("worker_id", str, required=True),
            OpenApiParameter("attempt", int, required=True),
        ],
        request={"text/plain": OpenApiTypes.STR},
        responses={200: ValueUploadOutput, 409: CLAIM_REFUSED, 503: STORE_FAILED},
        summary="Upload a result's value as a stream, to name it in the result report",
        description=(
            "The body is the value as raw UTF-8 (text/plain; charset=utf-8), at most "
            "BATON_MAX_RESULT_BYTES. It is stored under its sha256, which the answer gives as "
            "value_upload for the result report to name; the same text again stores nothing "
            "new. Fenced like a report: only the claim that holds the running turn may upload."
        ),
    )
    def put(self, request: Request, subtask_id: int) -> Response:
        claim = ClaimQuery(data=request.query_params)
        claim.is_valid(raise_exception=True)
        _require_utf8_text(request)
        artifact = reports.upload_result_value(
            worker=authenticated_user(request),
            subtask_id=subtask_id,
            # No body at all is an empty value.
            stream=request.stream or io.BytesIO(),
            **claim.validated_data,
        )
        return Response(
            ValueUploadOutput(
                {
                    "value_upload": artifact.sha256,
                    "artifact_id": artifact.pk,
                    "size_chars": artifact.size_chars,
                    "size_bytes": artifact.size_bytes,
                    "size_lines": artifact.size_lines,
                }
            ).data
        )


def _require_utf8_text(request: Request) -> None:
    """415 unless the body is declared `text/plain` in UTF-8 (the charset may be left out)."""
    django_request = request._request
    charset = (django_request.content_params or {}).get("charset", "utf-8").lower()
    if django_request.content_type != "text/plain" or charset not in ("utf-8", "utf8"):
        raise UnsupportedMediaType(
            request.content_type, detail="Send the value as text/plain; charset=utf-8."
        )
