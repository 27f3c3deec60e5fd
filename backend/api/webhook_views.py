"""The webhook API: a product account registers, lists and removes its endpoints and reads
their deliveries. Another account's endpoints and tasks are 404."""

from __future__ import annotations

from drf_spectacular.utils import extend_schema
from rest_framework import status
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from backend.api.pagination import TaskPagination
from backend.api.permissions import IsProductClient, authenticated_user
from backend.api.webhook_serializers import (
    WebhookCreatedOutput,
    WebhookCreateInput,
    WebhookDeliveryOutput,
    WebhookOutput,
)
from backend.tasks.selectors import get_own_task
from backend.webhooks import selectors, services


class WebhookListCreateApi(APIView):
    permission_classes = [IsProductClient]

    @extend_schema(
        operation_id="webhooks_list",
        responses=WebhookOutput(many=True),
        summary="Your webhook endpoints, newest first (never their secrets)",
    )
    def get(self, request: Request) -> Response:
        paginator = TaskPagination()
        endpoints = selectors.endpoint_list(owner=authenticated_user(request))
        page = paginator.paginate_queryset(endpoints, request, view=self)
        return paginator.get_paginated_response(WebhookOutput(page, many=True).data)

    @extend_schema(
        operation_id="webhooks_create",
        request=WebhookCreateInput,
        responses={201: WebhookCreatedOutput},
        summary="Register a URL for your turns' completion, failure and cancellation",
    )
    def post(self, request: Request) -> Response:
        payload = WebhookCreateInput(data=request.data)
        payload.is_valid(raise_exception=True)
        data = payload.validated_data
        user = authenticated_user(request)
        task_id = data.get("task")
        if task_id is not None:
            get_own_task(user=user, task_id=task_id)
        endpoint = services.create_endpoint(
            owner=user, url=data["url"], task_id=task_id, events=data.get("events")
        )
        return Response(WebhookCreatedOutput(endpoint).data, status=status.HTTP_201_CREATED)


class WebhookDetailApi(APIView):
    permission_classes = [IsProductClient]

    @extend_schema(operation_id="webhooks_delete", request=None, responses={204: None})
    def delete(self, request: Request, endpoint_id: int) -> Response:
        endpoint = selectors.get_endpoint(
            owner=authenticated_user(request), endpoint_id=endpoint_id
        )
        services.delete_endpoint(endpoint=endpoint)
        return Response(status=status.HTTP_204_NO_CONTENT)


class WebhookDeliveriesApi(APIView):
    permission_classes = [IsProductClient]

    @extend_schema(
        operation_id="webhooks_deliveries_list",
        responses=WebhookDeliveryOutput(many=True),
        summary="The endpoint's deliveries, newest first: status, attempts, last status code",
    )
    def get(self, request: Request, endpoint_id: int) -> Response:
        endpoint = selectors.get_endpoint(
            owner=authenticated_user(request), endpoint_id=endpoint_id
        )
        paginator = TaskPagination()
        page = paginator.paginate_queryset(
            selectors.endpoint_deliveries(endpoint=endpoint), request, view=self
        )
        return paginator.get_paginated_response(WebhookDeliveryOutput(page, many=True).data)
