"""The circuit breaker's state machine against real Redis, with a fake clock."""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence

import pytest
import redis

from ctxcore.messages import AnyMessage, UserMessage
from ctxcore.summarize.errors import ModelCallError
from ctxcore.summarize.model import Completion, OutputContract, Usage
from tests.chaos.processes import quick_client
from workers.circuit import CircuitBreaker, CircuitBreakerClient, CircuitOpenError
from workers.keyspace import delete_prefixed_keys
from workers.redis_clients import cluster_client

pytestmark = [pytest.mark.chaos, pytest.mark.redis]

URL = "http://127.0.0.1:9/v1"


class _Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class _Model:
    """A client whose next outcomes are scripted (an exception or a text)."""

    name = "scripted"

    def __init__(self) -> None:
        self.outcomes: list[Exception | str] = []
        self.calls = 0

    def complete(
        self, messages: Sequence[AnyMessage], *, max_tokens: int, contract: OutputContract | None = None
    ) -> Completion:
        self.calls += 1
        outcome = self.outcomes.pop(0) if self.outcomes else "ok"
        if isinstance(outcome, Exception):
            raise outcome
        return Completion(outcome, Usage(1, 1, 2))


@pytest.fixture(params=["redis", pytest.param("redis_cluster", marks=pytest.mark.redis_cluster)])
def client(request: pytest.FixtureRequest, redis_prefix: str) -> Iterator[redis.Redis]:
    """The plain Redis, then the Redis Cluster (this test's keys deleted from it after)."""
    if request.param == "redis_cluster":
        c = cluster_client(request.getfixturevalue("redis_cluster_nodes"))
        yield c
        delete_prefixed_keys(c, redis_prefix)
    else:
        c = redis.Redis.from_url(request.getfixturevalue("redis_url"))
        yield c
    c.close()


def _call(wrapped: CircuitBreakerClient) -> str:
    try:
        wrapped.complete([UserMessage(content="x")], max_tokens=10)
    except CircuitOpenError:
        return "refused"
    except ModelCallError as exc:
        return exc.kind
    return "ok"


def test_opens_after_n_consecutive_failures_then_half_opens_one_probe(
    client: redis.Redis, redis_prefix: str
) -> None:
    clock = _Clock()
    breaker = CircuitBreaker(client, redis_prefix, failure_threshold=3, reset_seconds=30, clock=clock)
    model = _Model()
    refused: list[int] = []
    wrapped = CircuitBreakerClient(model, breaker, "t1", URL, on_refused=lambda: refused.append(1))

    # Successes in between reset the count: failures must be consecutive.
    model.outcomes = [ModelCallError("server_unstable", "500"), ModelCallError("timeout", "slow"), "ok"]
    assert [_call(wrapped) for _ in range(3)] == ["server_unstable", "timeout", "ok"]
    assert breaker.state("t1", URL) == "closed" and breaker.failures("t1", URL) == 0
    # Answers about our request (overflow, bad request) neither count nor reset.
    model.outcomes = [
        ModelCallError("rate_limit", "429"),
        ModelCallError("context_overflow", "too long"),
        ModelCallError("api_request_error", "bad"),
        ModelCallError("server_unstable", "503"),
        ModelCallError("unknown", "garbage"),
    ]
    assert [_call(wrapped) for _ in range(5)] == [
        "rate_limit",
        "context_overflow",
        "api_request_error",
        "server_unstable",
        "unknown",
    ]
    assert breaker.state("t1", URL) == "open"
    calls = model.calls
    assert [_call(wrapped) for _ in range(4)] == ["refused"] * 4
    assert model.calls == calls and len(refused) == 4
    try:
        wrapped.complete([UserMessage(content="x")], max_tokens=10)
    except CircuitOpenError as exc:
        assert exc.kind == "server_unstable" and exc.transient and exc.retry_after == pytest.approx(30)
    # Other tenants and endpoints are not affected.
    assert breaker.allow("t2", URL).allowed and breaker.allow("t1", URL + "x").allowed

    # Half-open after 30 s: exactly one probe among concurrent callers.
    clock.now += 30
    decisions = []
    barrier = threading.Barrier(8)

    def ask() -> None:
        barrier.wait()
        decisions.append(breaker.allow("t1", URL))

    threads = [threading.Thread(target=ask) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sum(d.allowed for d in decisions) == 1 and sum(d.probe for d in decisions) == 1
    # The probe fails: open again for another period.
    breaker.record_failure("t1", URL)
    assert breaker.state("t1", URL) == "open" and not breaker.allow("t1", URL).allowed
    # A probe that never reports (its worker died) does not wedge the circuit.
    clock.now += 30
    assert breaker.allow("t1", URL).probe
    clock.now += 10
    assert not breaker.allow("t1", URL).allowed
    clock.now += 20
    model.outcomes = ["ok"]
    assert _call(wrapped) == "ok"
    assert breaker.state("t1", URL) == "closed" and breaker.failures("t1", URL) == 0
    assert _call(wrapped) == "ok"


def test_key_layout_a_hash_tag_per_tenant_and_no_raw_url(client: redis.Redis, redis_prefix: str) -> None:
    breaker = CircuitBreaker(client, redis_prefix, failure_threshold=1)
    secret_url = "https://user:hunter2@api.example.invalid/v1"
    breaker.record_failure("t1", secret_url)
    keys = [k.decode() for k in client.scan_iter(match=f"{{{redis_prefix}:circuit:*")]
    assert (
        len(keys) == 1 and "hunter2" not in keys[0] and keys[0].startswith(f"{{{redis_prefix}:circuit:t1}}:")
    )
    assert 0 < client.ttl(keys[0]) <= 7 * 24 * 3600


def test_redis_down_lets_calls_through() -> None:
    dead = quick_client("redis://127.0.0.1:9/0")
    breaker = CircuitBreaker(dead, "x", failure_threshold=1)
    model = _Model()
    wrapped = CircuitBreakerClient(model, breaker, "t1", URL)
    model.outcomes = [ModelCallError("server_unstable", "500"), "ok"]
    assert _call(wrapped) == "server_unstable"
    assert _call(wrapped) == "ok" and model.calls == 2
