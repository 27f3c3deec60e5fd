"""Executor worker identity: ordinary user accounts in the executor group, each with its token.

Owns the one answer to "is this caller a worker?", which the executor API's permission asks on
every request. Every claim, heartbeat and report names the worker account that holds it, so a
worker can only ever act on turns its own account claimed.
"""

from __future__ import annotations

from django.contrib.auth import get_user_model
from django.contrib.auth.models import AnonymousUser, Group, User
from rest_framework.authtoken.models import Token

EXECUTOR_GROUP = "baton-executors"


# Where the answer is kept on the account object for the rest of the request.
_IS_WORKER_CACHE = "_baton_is_worker"


def is_executor_worker(user: User | AnonymousUser) -> bool:
    """Whether `user` is an executor worker account (asked once per request, then cached)."""
    if not user.is_authenticated:
        return False
    cached: bool | None = getattr(user, _IS_WORKER_CACHE, None)
    if cached is None:
        cached = user.groups.filter(name=EXECUTOR_GROUP).exists()
        setattr(user, _IS_WORKER_CACHE, cached)
    return cached


def ensure_worker_account(*, username: str, rotate_token: bool = False) -> tuple[User, str]:
    """The worker account `username` (created without a password if new) and its API token."""
    worker, created = get_user_model().objects.get_or_create(username=username)
    if created:
        worker.set_unusable_password()
        worker.save()
    worker.groups.add(Group.objects.get_or_create(name=EXECUTOR_GROUP)[0])
    if rotate_token:
        Token.objects.filter(user=worker).delete()
    return worker, Token.objects.get_or_create(user=worker)[0].key
