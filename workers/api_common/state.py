"""``ApiState``: what the routes of the API, the proxy and the UI share (runtime, queue, the
lazily built service and rate limiter, conversation keys)."""

from threading import Lock

from ctxcore.errors import InvalidKeyError
from ctxcore.state import ConversationKey
from workers.api_common.errors import ApiError, not_found
from workers.prom_api import ApiMetrics
from workers.ratelimit import RateLimiter
from workers.runtime import Runtime, build_service
from workers.service import CompactionQueue, ContextService

__all__ = ["ApiState"]


class ApiState:
    """The state routes share: runtime, queue, the lazily built service and rate limiter."""

    def __init__(self, runtime: Runtime, queue: CompactionQueue, metrics_dir: str | None = None) -> None:
        self.runtime = runtime
        self.settings = runtime.settings
        self.queue = queue
        # Prometheus series of this app (its own registry: see workers/prom_api.py; summed
        # over ``metrics_dir``'s processes with ``ctxcore serve --workers N``).
        self.metrics = ApiMetrics(metrics_dir)
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

    def key(self, tenant: str, conversation_id: str) -> ConversationKey:
        """The conversation's key; an invalid id is a 422 naming the id rule (no tenant can
        own such an id, so saying so reveals nothing about anyone's conversations)."""
        try:
            return ConversationKey(tenant, conversation_id)
        except InvalidKeyError as exc:
            raise ApiError(422, "invalid_conversation_id", str(exc)) from None

    def exists(self, key: ConversationKey) -> bool:
        """True when the conversation has a log or a saved state."""
        return self.runtime.log.last_id(key) is not None or self.runtime.state_store.load(key) is not None

    def require(self, tenant: str, conversation_id: str) -> ConversationKey:
        """The key of an existing conversation of ``tenant``, or 404."""
        key = self.key(tenant, conversation_id)
        if not self.exists(key):
            raise not_found()
        return key
