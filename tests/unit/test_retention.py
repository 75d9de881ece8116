"""``retention_days``: validated at construction, turned into the stores' ``Retention``."""

from __future__ import annotations

import pytest

from ctxcore.config import Settings
from ctxcore.errors import ConfigError
from ctxcore.state.retention import Retention
from workers.runtime import retention_of

DAY = 86400.0


@pytest.mark.parametrize(
    "data",
    [
        {"service": {"retention_days": 0}},
        {"service": {"retention_days": -3}},
        {"tenants": {"acme": {"retention_days": 0}}},
    ],
)
def test_a_non_positive_retention_is_a_config_error(data: dict[str, object]) -> None:
    with pytest.raises(ConfigError, match="retention_days"):
        Settings.load(data)


def test_retention_days_from_the_environment() -> None:
    settings = Settings.from_env(
        {"CTXCORE_SERVICE__RETENTION_DAYS": "30", "CTXCORE_TENANTS__Acme__RETENTION_DAYS": "7"}
    )
    retention = retention_of(settings)
    assert retention.seconds_for("other") == 30 * DAY
    assert retention.seconds_for("Acme") == 7 * DAY
    assert retention.ttl_ms("Acme") == 7 * 86_400_000


def test_no_retention_by_default() -> None:
    retention = retention_of(Settings())
    assert not retention.enabled
    assert retention.ttl_ms("any") == 0
    assert not retention.refresh_due("any", -1)


def test_a_tenant_alone_can_have_a_retention() -> None:
    retention = retention_of(Settings.load({"tenants": {"acme": {"retention_days": 2}, "b": {}}}))
    assert retention.enabled
    assert retention.seconds_for("acme") == 2 * DAY
    assert retention.seconds_for("b") is None


def test_refresh_is_due_only_an_hour_below_the_full_retention() -> None:
    retention = Retention(seconds=DAY)
    full = int(DAY * 1000)
    assert not retention.refresh_due("t", full - 3_599_000)
    assert retention.refresh_due("t", full - 3_601_000)
    assert retention.refresh_due("t", -1)  # a key without a TTL (retention set later)
    short = Retention(seconds=2.0)  # under two hours: half of it
    assert not short.refresh_due("t", 1500) and short.refresh_due("t", 900)


def test_offloads_keep_their_own_ttl_only_when_it_is_shorter() -> None:
    assert Retention(seconds=DAY, offload_ttl_seconds=600).offloads_apart("t")
    assert not Retention(seconds=DAY, offload_ttl_seconds=2 * DAY).offloads_apart("t")
    assert not Retention(seconds=DAY).offloads_apart("t")


def test_retention_rejects_non_positive_seconds() -> None:
    with pytest.raises(ConfigError, match="positive"):
        Retention(seconds=0)
    with pytest.raises(ConfigError, match="acme"):
        Retention(tenants={"acme": -1.0})


class _Timer:
    def __init__(self) -> None:
        self.calls: list[tuple[float, object]] = []

    def call_repeatedly(self, interval: float, fn: object, priority: int = 0) -> object:
        self.calls.append((interval, fn))
        return _Ref()


class _Ref:
    def cancel(self) -> None:
        pass


@pytest.mark.parametrize("days", [None, 30])
def test_the_reconciler_step_runs_the_sweep_only_with_a_retention(days: int | None) -> None:
    from workers import app as app_module
    from workers.reconciler import Reconciler, reconcile_once, sweep_once
    from workers.retention import SWEEP_EVERY_SECONDS

    previous = app_module._state.settings
    app_module.configure(Settings.load({"service": {"retention_days": days}}))
    try:
        parent = type("Parent", (), {"timer": _Timer()})()
        step = Reconciler(parent)
        step.start(parent)
        expected = [reconcile_once] + ([sweep_once] if days else [])
        assert [fn for _, fn in parent.timer.calls] == expected
        if days:
            assert parent.timer.calls[1][0] == SWEEP_EVERY_SECONDS
        step.stop(parent)
    finally:
        if previous is not None:
            app_module.configure(previous)
        else:
            app_module._state.settings = app_module._state.runtime = None
