"""Who may call what: product clients use the task API, executor workers the executor API, and
operators (staff) reach other accounts' data only with the Django model permissions the admin
asks for the same thing (`backend.model_permissions`).

Reads are scoped by the selectors' querysets: a row the caller may not see is 404. Writes to a
row the caller sees are decided here: an owned row is its owner's (`OwnerOrModelPermissions`),
any other needs the model's permission for the action, else 403 naming it. Rows without an
owner, such as history policies, are the operators' alone (`ModelPermissions`).
"""

from __future__ import annotations

from typing import Any

from django.contrib.auth.models import User
from django.db.models import Model
from rest_framework.exceptions import NotAuthenticated
from rest_framework.permissions import SAFE_METHODS, BasePermission
from rest_framework.request import Request
from rest_framework.views import APIView

from backend.dispatch.workers import is_executor_worker
from backend.model_permissions import (
    ADD,
    CHANGE,
    DELETE,
    VIEW,
    Action,
    operator_may,
    permission_name,
)


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


def _action(request: Request) -> Action:
    """The admin's action for a request's method: view to read, delete to delete, else change."""
    if request.method in SAFE_METHODS:
        return VIEW
    return DELETE if request.method == "DELETE" else CHANGE


def _permission_model(view: APIView) -> type[Model]:
    """The model whose permissions guard the view (its `permission_model`)."""
    model: type[Model] = getattr(view, "permission_model")  # noqa: B009 - every user sets it
    return model


class OwnerOrModelPermissions(BasePermission):
    """A row with an owner (a task, a webhook endpoint), once the view's scoped queryset has
    found it (`check_object_permissions`): its owner may do anything the API offers with it;
    anyone else (an operator the queryset showed it to) needs the permission of the view's
    `permission_model` for the action: view to read, delete to delete, change for any other
    write (a follow-up, a cancel, an interrupt). Refused: 403 naming the permission."""

    def has_object_permission(self, request: Request, view: APIView, obj: Any) -> bool:
        user = authenticated_user(request)
        if obj.owner_id == user.pk:
            return True
        action, model = _action(request), _permission_model(view)
        if operator_may(user, action, model):
            return True
        self.message = (
            f"This is another account's; it needs the {permission_name(action, model)} "
            "permission on a staff account."
        )
        return False


class ModelPermissions(BasePermission):
    """Rows no account owns (history policies): the view's `permission_model` as the admin
    guards it. Reading needs its view (or change) permission, a write its change permission,
    and a write that creates the row (`check_object_permissions` with an unsaved one) its add
    permission too. Refused: 403 naming the permission."""

    def has_permission(self, request: Request, view: APIView) -> bool:
        return self._may(request, _action(request), _permission_model(view))

    def has_object_permission(self, request: Request, view: APIView, obj: Any) -> bool:
        if obj.pk is not None or request.method in SAFE_METHODS:
            return True
        return self._may(request, ADD, _permission_model(view))

    def _may(self, request: Request, action: Action, model: type[Model]) -> bool:
        if operator_may(request.user, action, model):
            return True
        self.message = (
            f"This needs the {permission_name(action, model)} permission on a staff account."
        )
        return False
