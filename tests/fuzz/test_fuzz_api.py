"""schemathesis against the published OpenAPI document of ``workers.http.create_app``.

Every operation gets about 50 generated requests (``CTXCORE_LONG=1``: 500), authenticated
as a real tenant, against a real Redis: no response is a 5xx, every status code, content
type, header and body matches what the document publishes. A second pass sends the same
operations without a token: always 401, never anything else.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest
import redis
import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis import checks

from ctxcore.config import Settings, hash_token
from tests.chaos.helpers import LONG
from workers.http import create_app
from workers.runtime import Runtime
from workers.service import InlineQueue

pytestmark = [pytest.mark.fuzz, pytest.mark.redis]

DB = 9
TOKEN = "fuzz-token-of-tenant-a"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
CHECKS = [
    checks.not_a_server_error,
    checks.status_code_conformance,
    checks.content_type_conformance,
    checks.response_headers_conformance,
    checks.response_schema_conformance,
]
EXAMPLES = settings(
    max_examples=500 if LONG else 50,
    deadline=None,
    suppress_health_check=list(HealthCheck),
)


@pytest.fixture()
def api_schema(redis_url: str) -> Iterator[schemathesis.BaseSchema]:
    url = f"{redis_url.rsplit('/', 1)[0]}/{DB}"
    prefix = f"apifuzz{uuid.uuid4().hex[:6]}"
    settings_ = Settings.load(
        {
            "redis": {"url": url, "key_prefix": prefix},
            "http": {
                "tokens": {hash_token(TOKEN): "tenant-a"},
                "requests_per_second": 100_000,
                "burst": 100_000,
                "max_body_bytes": 256 * 1024,
            },
            "service": {"max_messages_per_append": 50, "max_message_chars": 20_000},
        }
    )
    runtime = Runtime(settings_)
    app = create_app(runtime, InlineQueue())
    # A conversation that exists, so generated ids sometimes hit one.
    runtime.log.append(
        __import__("ctxcore.state", fromlist=["ConversationKey"]).ConversationKey("tenant-a", "a"),
        __import__("ctxcore.messages", fromlist=["from_openai"]).from_openai(
            [{"role": "user", "content": "hi"}]
        ),
    )
    yield schemathesis.openapi.from_asgi("/openapi.json", app)
    client = redis.Redis.from_url(url)
    for pattern in (f"{prefix}:*", f"{{{prefix}:*"):
        keys = list(client.scan_iter(match=pattern, count=1000))
        if keys:
            client.delete(*keys)
    client.close()
    runtime.redis.close()


def _operations(schema: schemathesis.BaseSchema) -> list[schemathesis.APIOperation]:
    return [result.ok() for result in schema.get_all_operations()]


# schemathesis' own pytest plugin does not run under pytest 9 yet, so each operation's
# hypothesis strategy is driven directly; a failure names the operation.
def test_generated_requests_never_5xx_and_match_the_schema(api_schema: schemathesis.BaseSchema) -> None:
    operations = _operations(api_schema)
    assert len(operations) >= 9
    for operation in operations:

        @EXAMPLES
        @given(case=operation.as_strategy())
        def run(case: schemathesis.Case) -> None:
            response = case.call(headers=AUTH)
            case.validate_response(response, checks=CHECKS, headers=AUTH)

        try:
            run()
        except Exception as exc:
            raise AssertionError(f"{operation.label}: {str(exc)[:3000]}") from exc


def test_without_a_token_every_tenant_route_is_401(api_schema: schemathesis.BaseSchema) -> None:
    for operation in _operations(api_schema):

        @settings(max_examples=10, deadline=None, suppress_health_check=list(HealthCheck))
        @given(case=operation.as_strategy())
        def run(case: schemathesis.Case) -> None:
            response = case.call()
            if case.path.startswith("/v1/"):
                assert response.status_code in (401, 413), (case.method, case.path, response.status_code)
            else:
                assert response.status_code < 500

        run()
