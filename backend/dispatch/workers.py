"""Executor worker accounts: ordinary users in the executor group, each with its own token."""

from __future__ import annotations

from django.contrib.auth import get_user_model
from django.contrib.auth.models import AbstractBaseUser, Group
from rest_framework.authtoken.models import Token

from backend.dispatch.services import EXECUTOR_GROUP


def ensure_worker_account(
    *, username: str, rotate_token: bool = False
) -> tuple[AbstractBaseUser, str]:
    """The worker account `username` (created without a password if new) and its API token."""
    worker, created = get_user_model().objects.get_or_create(username=username)
    if created:
        worker.set_unusable_password()
        worker.save()
    worker.groups.add(Group.objects.get_or_create(name=EXECUTOR_GROUP)[0])
    if rotate_token:
        Token.objects.filter(user=worker).delete()
    return worker, Token.objects.get_or_create(user=worker)[0].key
