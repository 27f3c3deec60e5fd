"""Who may call what: product clients use the task API, executor workers the executor API."""

from __future__ import annotations

from django.contrib.auth.models import User
from rest_framework.exceptions import NotAuthenticated
from rest_framework.permissions import BasePermission
from rest_framework.request import Request
from rest_framework.views import APIView

from backend.dispatch.workers import is_executor_worker


class IsExecutorWorker(BasePermission):
    """Accounts in the executor group (created with `manage.py create_worker`)."""

    message = "This endpoint is for executor workers; this account is not one."

    def has_permission(self, request: Request, view: APIView) -> bool:
        return bool(request.user and is_executor_worker(request.user))


class IsProductClient(BasePermission):
    """Authenticated accounts that are not executor workers."""

    message = "Executor worker accounts cannot use the task API."

    def has_permission(self, request: Request, view: APIView) -> bool:
        user = request.user
        return bool(user and user.is_authenticated and not is_executor_worker(user))


def authenticated_user(request: Request) -> User:
    """The account behind a request that a view's permission classes let in.

    Every Baton view requires an authenticated account, so this only narrows the type; an
    anonymous request reaching it would be answered as unauthenticated.
    """
    user = request.user
    if not isinstance(user, User):
        raise NotAuthenticated
    return user
