"""The Django model permissions an operator holds, read as the admin reads them.

The API gives a staff account what the Django admin gives it, and no more: another account's
rows are seen only with the model's view permission (or its change permission, which the admin
lets see too), changed only with its change permission, created or deleted only with its add or
delete permission. As in the admin, a permission counts only on an active staff account, and a
superuser holds every one. An account's own tasks and endpoints need none: those are its own.

Every layer asks here (the selectors that scope querysets, the API's permission classes), so
the rule is written once; it imports nothing of Baton's.
"""

from __future__ import annotations

from typing import Literal

from django.contrib.auth import get_permission_codename
from django.contrib.auth.models import AnonymousUser, User
from django.db.models import Model

Action = Literal["view", "change", "add", "delete"]
VIEW: Action = "view"
CHANGE: Action = "change"
ADD: Action = "add"
DELETE: Action = "delete"


def permission_name(action: Action, model: type[Model]) -> str:
    """The permission as Django names it: `tasks.change_task`."""
    options = model._meta
    return f"{options.app_label}.{get_permission_codename(action, options)}"


def operator_may(user: User | AnonymousUser, action: Action, model: type[Model]) -> bool:
    """Whether `user` is an operator (an active staff account) holding the permission to
    `action` any row of `model` (a superuser holds all). No query for anyone but staff."""
    if not (user.is_active and user.is_staff):
        return False
    if user.has_perm(permission_name(action, model)):
        return True
    # The admin shows a model's rows to whoever may change them.
    return action == VIEW and user.has_perm(permission_name(CHANGE, model))
