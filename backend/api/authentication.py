"""Token authentication that remembers a token's account for a few seconds.

A busy worker sends two requests per turn (dispatch, then the result), and each would look its
token up and ask whether the account is in the worker group: two queries, and ORM work, before
the view starts. A server process keeps a successful lookup, the worker answer included, for
BATON_TOKEN_CACHE_SECONDS. A change to tokens, accounts or group membership clears the
process's cache at once (signals); other processes notice within that many seconds. Failed
lookups are never kept, so a new token works at once everywhere.
"""

from __future__ import annotations

import copy
import threading
import time
from typing import Any

from django.conf import settings
from django.contrib.auth.models import User
from django.db.models.signals import m2m_changed, post_delete, post_save
from rest_framework.authentication import TokenAuthentication
from rest_framework.authtoken.models import Token

from backend.dispatch.workers import is_executor_worker

# At most this many tokens are remembered; a full cache starts over.
MAX_ENTRIES = 4096

_entries: dict[str, tuple[float, User, Token]] = {}
_lock = threading.Lock()


class CachedTokenAuthentication(TokenAuthentication):
    def authenticate_credentials(self, key: str) -> tuple[User, Token]:
        ttl = settings.BATON_TOKEN_CACHE_SECONDS
        now = time.monotonic()
        entry = _entries.get(key) if ttl > 0 else None
        if entry is not None and entry[0] > now:
            _, user, token = entry
            # Each request gets its own copy: nothing one request sets on it reaches another.
            return copy.copy(user), token
        user, token = super().authenticate_credentials(key)
        if ttl > 0:
            is_executor_worker(user)  # kept on the account object, and so in the cache
            with _lock:
                if len(_entries) >= MAX_ENTRIES:
                    _entries.clear()
                _entries[key] = (now + ttl, user, token)
            return copy.copy(user), token
        return user, token


def forget_tokens(**_: Any) -> None:
    """Drop every remembered token: an account, a token or a group membership changed."""
    with _lock:
        _entries.clear()


post_save.connect(forget_tokens, sender=Token, dispatch_uid="baton-token-cache-token-saved")
post_delete.connect(forget_tokens, sender=Token, dispatch_uid="baton-token-cache-token-deleted")
post_save.connect(forget_tokens, sender=User, dispatch_uid="baton-token-cache-user-saved")
post_delete.connect(forget_tokens, sender=User, dispatch_uid="baton-token-cache-user-deleted")
m2m_changed.connect(
    forget_tokens, sender=User.groups.through, dispatch_uid="baton-token-cache-groups-changed"
)
