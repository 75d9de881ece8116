"""State the HTTP routes share (``ApiState``) and the bearer-token dependency."""

import hmac
from collections.abc import Callable
from threading import Lock
from typing import Annotated

from fastapi import Depends
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from ctxcore.config import hash_token
from ctxcore.errors import InvalidKeyError
from ctxcore.state import ConversationKey
from workers.http_errors import ApiError, not_found
from workers.prom_api import ApiMetrics
from workers.ratelimit import RateLimiter
from workers.runtime import Runtime, build_service
from workers.service import CompactionQueue, ContextService

__all__ = ["ApiState", "parse_if_match", "tenant_dependency"]


class ApiState:
    """The state routes share: runtime, queue, the lazily built service and rate limiter."""

    def __init__(self, runtime: Runtime, queue: CompactionQueue) -> None:
        self.runtime = runtime
        self.settings = runtime.settings
        self.queue = queue
        # Prometheus series of this app (its own registry: see workers/prom_api.py).
        self.metrics = ApiMetrics()
        self._service: ContextService | None = None
        self._limiter: RateLimiter | None = None
        self._lock = Lock()

    @property
    def service(self) -> ContextService:
        """Built on first use: with SQL storage, building it touches the database, and an
        outage at start-up must be a 503 on that request, not a process that cannot start."""
        if self._service is None:
            with self._lock:
                if self._service is None:
                    self._service = build_service(self.runtime, self.queue)
        return self._service

    @property
    def limiter(self) -> RateLimiter:
        """The shared token buckets."""
        if self._limiter is None:
            with self._lock:
                if self._limiter is None:
                    self._limiter = RateLimiter(self.runtime.redis, self.settings.redis.key_prefix)
        return self._limiter

    def tenant_for_token(self, token: str) -> str | None:
        """The tenant of a bearer token, comparing digests in constant time.

        Every configured digest is compared (no early exit, no dict lookup), so the time
        taken does not depend on which entry, if any, matches.
        """
        candidate = hash_token(token)
        found: str | None = None
        for digest, tenant in self.settings.http.tokens.items():
            if hmac.compare_digest(candidate, digest):
                found = tenant
        return found

    def rate_limit(self, tenant: str) -> None:
        """Take one token from the tenant's bucket or raise 429."""
        http = self.settings.http
        rate = self.settings.tenant(tenant).requests_per_second or http.requests_per_second
        decision = self.limiter.take(tenant, rate, http.burst)
        if not decision.allowed:
            raise ApiError(
                429,
                "rate_limited",
                f"more than {rate:g} requests per second (burst {http.burst}); retry later",
                headers={"Retry-After": str(decision.retry_after)},
            )

    def key(self, tenant: str, conversation_id: str) -> ConversationKey:
        """The conversation's key; an invalid id is a 404 like any id the tenant does not own."""
        try:
            return ConversationKey(tenant, conversation_id)
        except InvalidKeyError:
            raise not_found() from None

    def exists(self, key: ConversationKey) -> bool:
        """True when the conversation has a log or a saved state."""
        return self.runtime.log.last_id(key) is not None or self.runtime.state_store.load(key) is not None

    def require(self, tenant: str, conversation_id: str) -> ConversationKey:
        """The key of an existing conversation of ``tenant``, or 404."""
        key = self.key(tenant, conversation_id)
        if not self.exists(key):
            raise not_found()
        return key

    def check_conversation_limit(self, tenant: str) -> None:
        """403 when the tenant already has ``max_conversations`` conversations.

        Only called for an append that would create a conversation. Two concurrent creations
        can both pass the check (it is not a transaction): the limit is a quota, not a lock.
        """
        limit = self.settings.tenant(tenant).max_conversations
        if limit is None:
            return
        existing = self.runtime.log.list_conversations(tenant, None, limit)
        if len(existing) >= limit:
            raise ApiError(
                403,
                "conversation_limit",
                f"tenant has reached its limit of {limit} conversations; delete one to start another",
            )


def tenant_dependency(api: ApiState) -> Callable[..., str]:
    """The dependency that authenticates a request and charges its tenant's rate limit."""
    bearer = HTTPBearer(auto_error=False, description="A tenant's API token (configured as its sha256)")

    def current_tenant(
        credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)],
    ) -> str:
        """Authenticate the request and charge the tenant's rate limit."""
        if credentials is None:
            raise ApiError(
                401,
                "unauthorized",
                "missing bearer token (Authorization: Bearer <token>)",
                headers={"WWW-Authenticate": 'Bearer realm="ctxcore"'},
            )
        tenant = api.tenant_for_token(credentials.credentials)
        if tenant is None:
            raise ApiError(
                401,
                "unauthorized",
                "invalid bearer token",
                headers={"WWW-Authenticate": 'Bearer realm="ctxcore", error="invalid_token"'},
            )
        api.rate_limit(tenant)
        return tenant

    return current_tenant


def parse_if_match(value: str | None) -> str | None:
    """The log id in an ``If-Match`` header: a bare id or an entity tag (``"id"``, ``W/"id"``)."""
    if value is None:
        return None
    text = value.strip()
    text = text.removeprefix("W/")
    if len(text) >= 2 and text[0] == text[-1] == '"':
        text = text[1:-1]
    return text
