"""The webhook API: a product account registers, lists and removes its endpoints and reads
their deliveries. Another account's endpoints are 404, except to an operator with the model
permissions the admin asks for the same: the endpoints' view permission to list them, the
deliveries' to read theirs, the endpoints' delete permission to remove one (else 403). An
endpoint hears its owner's tasks only, so one is registered for the caller's own tasks alone.
"""

from __future__ import annotations

from drf_spectacular.utils import extend_schema
from rest_framework import status
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from backend.api.pagination import TaskPagination
from backend.api.permissions import (
    IsProductClient,
    OwnerOrModelPermissions,
    authenticated_user,
)
from backend.api.serializers import PAGE_PARAMETERS, page_of
from backend.api.webhook_serializers import (
    WebhookCreatedOutput,
    WebhookCreateInput,
    WebhookDeliveryOutput,
    WebhookOutput,
)
from backend.tasks.selectors import get_own_task
from backend.webhooks import selectors, services
from backend.webhooks.models import WebhookDelivery, WebhookEndpoint


class WebhookListCreateApi(APIView):
    permission_classes = [IsProductClient]

    @extend_schema(
        operation_id="webhooks_list",
        parameters=PAGE_PARAMETERS,
        responses=page_of(WebhookOutput),
        summary="Your webhook endpoints, newest first (never their secrets)",
    )
    def get(self, request: Request) -> Response:
        paginator = TaskPagination()
        endpoints = selectors.endpoint_list(user=authenticated_user(request))
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


class EndpointApi(APIView):
    """A view of one endpoint, found through the caller's scoped queryset (404 when they may
    not see it), then checked: its owner's, or an operator's with `permission_model`'s
    permission for the action (403)."""

    permission_classes = [IsProductClient, OwnerOrModelPermissions]

    def endpoint(self, request: Request, endpoint_id: int) -> WebhookEndpoint:
        endpoint = selectors.get_endpoint(user=authenticated_user(request), endpoint_id=endpoint_id)
        self.check_object_permissions(request, endpoint)
        return endpoint


class WebhookDetailApi(EndpointApi):
    permission_model = WebhookEndpoint

    @extend_schema(operation_id="webhooks_delete", request=None, responses={204: None})
    def delete(self, request: Request, endpoint_id: int) -> Response:
        endpoint = self.endpoint(request, endpoint_id)
        services.delete_endpoint(endpoint=endpoint)
        return Response(status=status.HTTP_204_NO_CONTENT)


class WebhookDeliveriesApi(EndpointApi):
    permission_model = WebhookDelivery

    @extend_schema(
        operation_id="webhooks_deliveries_list",
        parameters=PAGE_PARAMETERS,
        responses=page_of(WebhookDeliveryOutput),
        summary="The endpoint's deliveries, newest first: status, attempts, last status code",
    )
    def get(self, request: Request, endpoint_id: int) -> Response:
        endpoint = self.endpoint(request, endpoint_id)
        paginator = TaskPagination()
        page = paginator.paginate_queryset(
            selectors.endpoint_deliveries(endpoint=endpoint), request, view=self
        )
        return paginator.get_paginated_response(WebhookDeliveryOutput(page, many=True).data)
