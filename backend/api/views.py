"""The task API: thin views that validate input, call one service or selector, shape output."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from django.http import HttpResponseBase
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiResponse, PolymorphicProxySerializer, extend_schema
from rest_framework import status
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from backend.api import body_limits
from backend.api.artifact_serializers import ArtifactContentQuery
from backend.api.artifact_views import JSONErrorsNegotiation, serve_artifact_content
from backend.api.client_connection import client_still_connected
from backend.api.errors import ErrorOutput
from backend.api.pagination import TaskPagination, TurnPagination
from backend.api.permissions import IsProductClient, OwnerOrModelPermissions, authenticated_user
from backend.api.renderers import BatonJSONRenderer
from backend.api.schema import STORE_FAILED, error_response
from backend.api.serializers import (
    PAGE_PARAMETERS,
    BotOutput,
    CancelQuery,
    MessageInput,
    QueuedMessageOutput,
    SteerOutput,
    SubtaskOutput,
    TaskCreateInput,
    TaskListFilters,
    TaskOutput,
    TaskWithTurnsOutput,
    TurnListQuery,
    TurnPageOutput,
    page_of,
)
from backend.dispatch import stops
from backend.dispatch.selectors import with_prompt_report_links
from backend.tasks import partial_texts, selectors, services
from backend.tasks.models import Subtask, Task
from backend.tasks.services import PipelineStep


def _with_turns(request: Request, task: Task) -> dict[str, Any]:
    task.turns_for_output = list(with_prompt_report_links(selectors.task_turns(task=task)))
    partial_texts.show_partial_texts(task.turns_for_output)
    task.queued_for_output = list(selectors.queued_messages(task=task))
    return TaskWithTurnsOutput(task, context={"request": request}).data


def _turns(request: Request, task: Task, turns: Sequence[Subtask]) -> Any:
    """`turns` as the task views show them, read again through `selectors.task_turns`."""
    shown = list(
        with_prompt_report_links(selectors.task_turns(task=task)).filter(
            pk__in=[turn.pk for turn in turns]
        )
    )
    partial_texts.show_partial_texts(shown)
    return SubtaskOutput(shown, many=True, context={"request": request}).data


def _shown_turn(turn: Subtask, *, context: dict[str, Any]) -> Any:
    # A task runs at most one turn at a time: at most one turn of a page has pieces to read.
    partial_texts.show_partial_texts([turn])
    return SubtaskOutput(turn, context=context).data


class TaskListCreateApi(APIView):
    permission_classes = [IsProductClient]
    body_limit = body_limits.NEW_TASK

    @extend_schema(
        operation_id="tasks_list",
        parameters=[TaskListFilters],
        responses=page_of(TaskOutput),
        summary="List the tasks you can see, newest first",
    )
    def get(self, request: Request) -> Response:
        filters = TaskListFilters(data=request.query_params.dict())
        filters.is_valid(raise_exception=True)
        tasks = selectors.task_list(
            user=authenticated_user(request),
            status=filters.validated_data.get("status"),
            task_type=filters.validated_data.get("task_type"),
        )
        paginator = TaskPagination()
        page = paginator.paginate_queryset(tasks, request, view=self)
        return paginator.get_paginated_response(TaskOutput(page, many=True).data)

    @extend_schema(
        operation_id="tasks_create",
        request=TaskCreateInput,
        responses={201: TaskWithTurnsOutput, 503: STORE_FAILED},
        summary="Create a task with its first message",
    )
    def post(self, request: Request) -> Response:
        payload = TaskCreateInput(data=request.data)
        payload.is_valid(raise_exception=True)
        data = payload.validated_data
        if "pipeline" in data:
            pipeline: list[PipelineStep] | PipelineStep = [
                PipelineStep(**step) for step in data["pipeline"]
            ]
        else:
            pipeline = PipelineStep(bot=data.get("bot"), executor=data.get("executor"))
        task = services.create_task(
            owner=authenticated_user(request),
            title=data["title"],
            task_type=data["task_type"],
            message=data["message"],
            pipeline=pipeline,
            sender=data["sender"],
            is_group_chat=data["is_group_chat"],
            follow_up_strategy=data["follow_up_strategy"],
        )
        return Response(_with_turns(request, task), status=status.HTTP_201_CREATED)


class TaskApi(APIView):
    """A view of one task. The task is found through the caller's scoped queryset
    (`selectors.visible_tasks`: 404 when they may not see it), then its permissions are
    checked: a read is for whoever sees it; a write (a follow-up, a cancel, an interrupt, a
    withdrawal) is for its owner, or an operator with the tasks' change permission (403)."""

    permission_classes = [IsProductClient, OwnerOrModelPermissions]
    permission_model = Task

    def task(self, request: Request, task_id: int) -> Task:
        task = selectors.get_task(user=authenticated_user(request), task_id=task_id)
        self.check_object_permissions(request, task)
        return task


class TaskDetailApi(TaskApi):
    @extend_schema(operation_id="tasks_retrieve", responses=TaskWithTurnsOutput)
    def get(self, request: Request, task_id: int) -> Response:
        task = self.task(request, task_id)
        return Response(_with_turns(request, task))


class TaskMessagesApi(TaskApi):
    body_limit = body_limits.FOLLOW_UP

    @extend_schema(
        operation_id="tasks_messages_create",
        request=MessageInput,
        responses={
            201: OpenApiResponse(
                SubtaskOutput(many=True), description="The round started: the new turns."
            ),
            202: OpenApiResponse(
                PolymorphicProxySerializer(
                    component_name="FollowUpAccepted",
                    serializers=[QueuedMessageOutput, SteerOutput],
                    resource_type_field_name=None,
                ),
                description=(
                    "Queued (strategy enqueue, or steer with no running turn that can take "
                    "it: `steer_fallback` says why): sent when the turns before it finish. "
                    "Or steered (strategy steer): stored as a USER turn and given to the "
                    "running turn, whose answer answers both; `turn.steered` in the task's "
                    "events says when the agent received it, `message.queued` if it fell back."
                ),
            ),
            409: error_response(
                "The task takes no more messages (it is cancelled), or no more queued ones."
            ),
            503: STORE_FAILED,
        },
        summary="Send a follow-up message; returns the new turns, or the queued message",
        description="In another account's task (an operator with the tasks' change "
        "permission), the message is recorded as the operator's: its `sender` is the "
        "operator's username, whatever the task is, and naming another sender is a 400.",
    )
    def post(self, request: Request, task_id: int) -> Response:
        task = self.task(request, task_id)
        payload = MessageInput(data=request.data)
        payload.is_valid(raise_exception=True)
        follow_up = services.send_message(
            task=task,
            message=payload.validated_data["message"],
            sender=services.recorded_sender(
                task=task,
                author=authenticated_user(request),
                sender=payload.validated_data["sender"],
            ),
            strategy=payload.validated_data.get("strategy"),
        )
        if follow_up.steer is not None:
            return Response(SteerOutput(follow_up.steer).data, status=status.HTTP_202_ACCEPTED)
        if follow_up.queued is not None:
            context = {"steer_fallback": follow_up.steer_fallback}
            return Response(
                QueuedMessageOutput(follow_up.queued, context=context).data,
                status=status.HTTP_202_ACCEPTED,
            )
        return Response(_turns(request, task, follow_up.turns), status=status.HTTP_201_CREATED)


class QueuedMessageCancelApi(TaskApi):
    @extend_schema(
        operation_id="tasks_queued_messages_cancel",
        request=None,
        responses={
            200: QueuedMessageOutput,
            409: error_response("The message was already sent or withdrawn."),
        },
        summary="Withdraw a queued follow-up before it is sent",
    )
    def post(self, request: Request, task_id: int, queued_id: int) -> Response:
        task = self.task(request, task_id)
        queued = services.withdraw_queued_message(task=task, queued_id=queued_id)
        return Response(QueuedMessageOutput(queued).data)


class TaskSubtasksApi(TaskApi):
    @extend_schema(
        operation_id="tasks_subtasks_list",
        parameters=[TurnListQuery],
        responses=TurnPageOutput,
        summary="The task's turns in message_id order, a page bounded in turns and in bytes",
    )
    def get(self, request: Request, task_id: int) -> Response:
        query = TurnListQuery(data=request.query_params.dict())
        query.is_valid(raise_exception=True)
        task = self.task(request, task_id)
        context = {"request": request}
        page = TurnPagination().paginate(
            with_prompt_report_links(selectors.task_turns(task=task)),
            request,
            query=query.page_query(),
            serialize=lambda turn: _shown_turn(turn, context=context),
        )
        return Response(page)


class TurnTextApi(TaskApi):
    """A turn's spilled text, whole: its artifact's content, served as the artifact API serves
    it (sha256-checked before the first byte, Range, ?lines=, ETag), to whoever may see the
    task."""

    renderer_classes = [BatonJSONRenderer]
    content_negotiation_class = JSONErrorsNegotiation

    @extend_schema(
        operation_id="tasks_subtasks_text",
        parameters=[ArtifactContentQuery],
        responses={
            (200, "text/plain"): OpenApiResponse(
                OpenApiTypes.STR, description="The whole text, or the requested lines."
            ),
            (206, "text/plain"): OpenApiResponse(
                OpenApiTypes.STR, description="The requested byte range."
            ),
            (404, "application/json"): ErrorOutput,
            (500, "application/json"): OpenApiResponse(
                ErrorOutput, description="Stored content missing or failing its sha256 check."
            ),
        },
        summary="The whole text of a turn whose text spilled (its preview object's url)",
    )
    def get(self, request: Request, task_id: int, subtask_id: int) -> HttpResponseBase:
        query = ArtifactContentQuery(data=request.query_params.dict())
        query.is_valid(raise_exception=True)
        task = self.task(request, task_id)
        artifact = selectors.spilled_text_artifact(task=task, subtask_id=subtask_id)
        return serve_artifact_content(
            request, artifact=artifact, line_range=query.validated_data.get("lines")
        )


def _answer_after_stops(
    request: Request, *, task: Task, subtask_ids: Sequence[int] | None, query: CancelQuery
) -> int:
    """The cancel's status code: 200, or with `?wait=true`, 200 once every stopped turn's
    worker confirmed its executor gone and 202 when the timeout (or the client) went first."""
    if not query.validated_data["wait"]:
        return status.HTTP_200_OK
    confirmed = stops.wait_for_stops(
        task_id=task.pk,
        subtask_ids=subtask_ids,
        timeout_seconds=query.validated_data["timeout"],
        still_connected=client_still_connected(request),
    )
    return status.HTTP_200_OK if confirmed else status.HTTP_202_ACCEPTED


CANCEL_RESPONSES_NOTE = (
    "With ?wait=true: 200 once the workers running the stopped turns confirmed that their "
    "executors' processes are gone; 202 when the timeout passed first (the turns are cancelled "
    "all the same, and a late result from them is refused)."
)


class TaskCancelApi(TaskApi):
    @extend_schema(
        operation_id="tasks_cancel",
        request=None,
        parameters=[CancelQuery],
        responses={200: TaskOutput, 202: TaskOutput},
        description=CANCEL_RESPONSES_NOTE,
    )
    def post(self, request: Request, task_id: int) -> Response:
        query = CancelQuery(data=request.query_params.dict())
        query.is_valid(raise_exception=True)
        task = self.task(request, task_id)
        task = services.cancel_task(task=task)
        code = _answer_after_stops(request, task=task, subtask_ids=None, query=query)
        return Response(TaskOutput(task).data, status=code)


class TurnCancelApi(TaskApi):
    @extend_schema(
        operation_id="tasks_subtasks_cancel",
        request=None,
        parameters=[CancelQuery],
        responses={
            200: SubtaskOutput(many=True),
            202: SubtaskOutput(many=True),
            409: error_response("The turn has finished: there is nothing to stop."),
        },
        summary="Stop one pending or running turn; the task stays open for a follow-up",
        description=CANCEL_RESPONSES_NOTE,
    )
    def post(self, request: Request, task_id: int, subtask_id: int) -> Response:
        query = CancelQuery(data=request.query_params.dict())
        query.is_valid(raise_exception=True)
        task = self.task(request, task_id)
        turns = services.cancel_turn(task=task, subtask_id=subtask_id)
        code = _answer_after_stops(
            request, task=task, subtask_ids=[turn.pk for turn in turns], query=query
        )
        return Response(_turns(request, task, turns), status=code)


class BotListApi(APIView):
    @extend_schema(
        operation_id="bots_list", parameters=PAGE_PARAMETERS, responses=page_of(BotOutput)
    )
    def get(self, request: Request) -> Response:
        paginator = TaskPagination()
        page = paginator.paginate_queryset(selectors.bot_list(), request, view=self)
        return paginator.get_paginated_response(BotOutput(page, many=True).data)


class BotDetailApi(APIView):
    @extend_schema(operation_id="bots_retrieve", responses=BotOutput)
    def get(self, request: Request, name: str) -> Response:
        return Response(BotOutput(selectors.get_bot(name=name)).data)
