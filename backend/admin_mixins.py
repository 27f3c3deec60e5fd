"""Admin building blocks shared by every app, outside the layered packages so any may use them.

`ReadOnlyAdminMixin` is for rows that only services write (turns, artifacts, prompt reports):
the admin shows them, never adds or changes them, and deletes them only where the admin says
`allow_delete = True`. It fits a ModelAdmin and an inline alike (their permission methods take
the same arguments, `obj` being optional).
"""

from __future__ import annotations

from typing import Any

from django.http import HttpRequest


class ReadOnlyAdminMixin:
    # Deleting through the admin bypasses the services; an admin opts in where that is safe.
    allow_delete = False

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return self.allow_delete and super().has_delete_permission(request, obj)  # type: ignore[misc]
