"""Create (or look up) an executor worker account and print its API token."""

from __future__ import annotations

from typing import Any

from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.core.management.base import BaseCommand, CommandParser
from rest_framework.authtoken.models import Token

from backend.dispatch.services import EXECUTOR_GROUP


class Command(BaseCommand):
    help = "Create an executor worker account (worker scope) and print its token."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("name", help="account name, e.g. worker-codex-1")
        parser.add_argument(
            "--rotate", action="store_true", help="replace the account's token with a new one"
        )

    def handle(self, *args: Any, name: str, rotate: bool, **options: Any) -> None:
        user, created = get_user_model().objects.get_or_create(username=name)
        if created:
            user.set_unusable_password()
            user.save()
        group, _ = Group.objects.get_or_create(name=EXECUTOR_GROUP)
        user.groups.add(group)
        if rotate:
            Token.objects.filter(user=user).delete()
        token, _ = Token.objects.get_or_create(user=user)
        self.stdout.write(token.key)
