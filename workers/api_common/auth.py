"""Authentication and rate limiting: the bearer-token dependency every ``/v1`` route takes,
and the token lookup and rate limit the proxy, the UI and admission call.

The tenant is looked up by the token's sha256 in ``http.tokens``; each authenticated
request takes one token from its tenant's bucket (429 with ``Retry-After`` when empty),
unless ``workers.admission`` admitted and charged it already, before reading its body.
"""

import hmac
from collections.abc import Callable
from typing import Annotated

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from ctxcore.config import Settings, hash_token
from workers.api_common.errors import ApiError
from workers.api_common.state import ApiState

__all__ = ["ADMITTED", "rate_limit", "tenant_dependency", "tenant_for_token"]

# The request scope's state key under which ``workers.admission`` leaves what the request's
# bearer token is (its tenant, admitted and charged; None: no tenant's): the dependency
# then neither compares the token again nor charges it again.
ADMITTED = "ctxcore_admitted_tenant"


def tenant_for_token(settings: Settings, token: str) -> str | None:
    """The tenant of a bearer token, comparing digests in constant time.

    Every configured digest is compared (no early exit, no dict lookup), so the time
    taken does not depend on which entry, if any, matches.
    """
    candidate = hash_token(token)
    found: str | None = None
    for digest, tenant in settings.http.tokens.items():
        if hmac.compare_digest(candidate, digest):
            found = tenant
    return found


def rate_limit(api: ApiState, tenant: str) -> None:
    """Take one token from the tenant's bucket or raise 429."""
    http = api.settings.http
    rate = api.settings.tenant(tenant).requests_per_second or http.requests_per_second
    decision = api.limiter.take(tenant, rate, http.burst)
    if not decision.allowed:
        raise ApiError(
            429,
            "rate_limited",
            f"more than {rate:g} requests per second (burst {http.burst}); retry later",
            headers={"Retry-After": str(decision.retry_after)},
        )


def tenant_dependency(api: ApiState) -> Callable[..., str]:
    """The dependency that authenticates a request and charges its tenant's rate limit."""
    bearer = HTTPBearer(auto_error=False, description="A tenant's API token (configured as its sha256)")

    def current_tenant(
        request: Request,
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
        state = request.scope.get("state", {})
        # workers.admission looked this request's token up already (and charged its tenant).
        admitted = ADMITTED in state
        tenant = state[ADMITTED] if admitted else tenant_for_token(api.settings, credentials.credentials)
        if tenant is None:
            raise ApiError(
                401,
                "unauthorized",
                "invalid bearer token",
                headers={"WWW-Authenticate": 'Bearer realm="ctxcore", error="invalid_token"'},
            )
        if not admitted:
            rate_limit(api, tenant)
        return str(tenant)

    return current_tenant
