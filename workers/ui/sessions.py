"""The inspector's sign-in: a bearer token exchanged once for a session cookie.

The token is posted in a form body (never in a URL) and checked like the API's. The
session lives in Redis under the sha256 of its cookie value (the store never holds a
usable cookie), with the tenant, the session's CSRF token and its expiry, for
``SESSION_SECONDS``: a session is over when Redis dropped it (its TTL ran out) or when its
stored expiry has passed (checked too, so a key whose TTL was lost still ends on time).
The cookie is HttpOnly, SameSite=Strict, path ``/ui`` (Secure over https).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass

import redis

from ctxcore.state.redis.common import translated

__all__ = ["COOKIE", "SESSION_SECONDS", "UiSession", "UiSessions"]

COOKIE = "ctxcore_ui"
SESSION_SECONDS = 8 * 3600


@dataclass(frozen=True)
class UiSession:
    """A signed-in tenant and the token its forms must send back."""

    tenant: str
    csrf: str

    def csrf_matches(self, sent: str | None) -> bool:
        """True when a form sent this session's CSRF token (compared in constant time)."""
        return sent is not None and hmac.compare_digest(sent.encode(), self.csrf.encode())


class UiSessions:
    """Sessions in Redis (see the module docstring)."""

    def __init__(
        self,
        client: redis.Redis,
        prefix: str,
        seconds: int = SESSION_SECONDS,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.client = client
        self.prefix = prefix
        self.seconds = seconds
        self.clock = clock

    def _name(self, cookie: str) -> str:
        return f"{self.prefix}:ui:session:{hashlib.sha256(cookie.encode()).hexdigest()}"

    def create(self, tenant: str) -> tuple[str, UiSession]:
        """A new session of ``tenant``: its cookie value and the session."""
        cookie, session = secrets.token_urlsafe(32), UiSession(tenant, secrets.token_urlsafe(32))
        expires = self.clock() + self.seconds
        value = json.dumps({"tenant": session.tenant, "csrf": session.csrf, "expires": expires})
        with translated("creating an inspector session"):
            self.client.set(self._name(cookie), value, ex=self.seconds)
        return cookie, session

    def get(self, cookie: str | None) -> UiSession | None:
        """The session of a cookie value; None when absent, unknown or expired (an expired
        one still stored is deleted)."""
        if not cookie or len(cookie) > 100:
            return None
        with translated("reading an inspector session"):
            raw = self.client.get(self._name(cookie))
        if raw is None:
            return None
        data = json.loads(raw)
        if float(data.get("expires", self.clock() + 1)) <= self.clock():
            self.delete(cookie)
            return None
        return UiSession(str(data["tenant"]), str(data["csrf"]))

    def delete(self, cookie: str | None) -> None:
        """Sign out (nothing when there is no such session)."""
        if cookie:
            with translated("ending an inspector session"):
                self.client.delete(self._name(cookie))
