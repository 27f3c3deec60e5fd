"""The task API: thin views that validate input, call one service or selector, shape output."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from drf_spectacular.utils import extend_schema
from rest_framework import status
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from backend.api import body_limits
from backend.api.pagination import TaskPagination, TurnPagination
from backend.api.permissions import IsProductClient, authenticated_user
from backend.api.serializers import (
    BotOutput,
    MessageInput,
    SubtaskOutput,
    TaskCreateInput,
    TaskListFilters,
    TaskOutput,
    TaskWithTurnsOutput,
    TurnListQuery,
)
from backend.tasks import selectors, services
from backend.tasks.models import Subtask, Task
from backend.tasks.services import PipelineStep


def _with_turns(task: Task, turns: Iterable[Subtask]) -> dict[str, Any]:
    task.turns_for_output = list(turns)
    return TaskWithTurnsOutput(task).data


class TaskListCreateApi(APIView):
    permission_classes = [IsProductClient]
    body_limit = body_limits.NEW_TASK

    @extend_schema(
        operation_id="tasks_list",
        parameters=[TaskListFilters],
        responses=TaskOutput(many=True),
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
        responses={201: TaskWithTurnsOutput},
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
        )
        return Response(
            _with_turns(task, selectors.task_turns(task=task)), status=status.HTTP_201_CREATED
        )


class TaskDetailApi(APIView):
    permission_classes = [IsProductClient]

    @extend_schema(operation_id="tasks_retrieve", responses=TaskWithTurnsOutput)
    def get(self, request: Request, task_id: int) -> Response:
        task = selectors.get_task(user=authenticated_user(request), task_id=task_id)
        return Response(_with_turns(task, selectors.task_turns(task=task)))


class TaskMessagesApi(APIView):
    permission_classes = [IsProductClient]
    body_limit = body_limits.FOLLOW_UP

    @extend_schema(
        operation_id="tasks_messages_create",
        request=MessageInput,
        responses={201: SubtaskOutput(many=True)},
        summary="Send a follow-up message; returns the new turns",
    )
    def post(self, request: Request, task_id: int) -> Response:
        task = selectors.get_task(user=authenticated_user(request), task_id=task_id)
        payload = MessageInput(data=request.data)
        payload.is_valid(raise_exception=True)
        turns = services.append_message(
            task=task,
            message=payload.validated_data["message"],
            sender=payload.validated_data["sender"],
        )
        return Response(SubtaskOutput(turns, many=True).data, status=status.HTTP_201_CREATED)


class TaskSubtasksApi(APIView):
    permission_classes = [IsProductClient]

    @extend_schema(
        operation_id="tasks_subtasks_list",
        parameters=[TurnListQuery],
        responses=SubtaskOutput(many=True),
        summary="The task's turns in message_id order",
    )
    def get(self, request: Request, task_id: int) -> Response:
        query = TurnListQuery(data=request.query_params.dict())
        query.is_valid(raise_exception=True)
        task = selectors.get_task(user=authenticated_user(request), task_id=task_id)
        paginator = TurnPagination()
        page = paginator.paginate_queryset(selectors.task_turns(task=task), request, view=self)
        return paginator.get_paginated_response(SubtaskOutput(page, many=True).data)


class TaskCancelApi(APIView):
    permission_classes = [IsProductClient]

    @extend_schema(operation_id="tasks_cancel", request=None, responses=TaskOutput)
    def post(self, request: Request, task_id: int) -> Response:
        task = selectors.get_task(user=authenticated_user(request), task_id=task_id)
        task = services.cancel_task(task=task)
        return Response(TaskOutput(task).data)


class TurnCancelApi(APIView):
    permission_classes = [IsProductClient]

    @extend_schema(
        operation_id="tasks_subtasks_cancel",
        request=None,
        responses=SubtaskOutput(many=True),
        summary="Stop one pending or running turn; the task stays open for a follow-up",
    )
    def post(self, request: Request, task_id: int, subtask_id: int) -> Response:
        task = selectors.get_task(user=authenticated_user(request), task_id=task_id)
        turns = services.cancel_turn(task=task, subtask_id=subtask_id)
        return Response(SubtaskOutput(turns, many=True).data)


class BotListApi(APIView):
    @extend_schema(operation_id="bots_list", responses=BotOutput(many=True))
    def get(self, request: Request) -> Response:
        paginator = TaskPagination()
        page = paginator.paginate_queryset(selectors.bot_list(), request, view=self)
        return paginator.get_paginated_response(BotOutput(page, many=True).data)


class BotDetailApi(APIView):
    @extend_schema(operation_id="bots_retrieve", responses=BotOutput)
    def get(self, request: Request, name: str) -> Response:
        return Response(BotOutput(selectors.get_bot(name=name)).data)
