"""Settings: defaults, file + env precedence, aliases, fail-fast validation."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ctxcore.config import Settings, hash_token
from ctxcore.errors import ConfigError


def test_defaults() -> None:
    s = Settings()
    assert s.service.trigger_ratio == 1.0 and s.service.target_ratio == 0.8
    assert s.redis.url == "redis://127.0.0.1:6379/0"
    assert s.model.offline and s.model.api_key_env == "OPENAI_API_KEY"


def test_constructed_settings_never_read_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CTXCORE_REDIS_URL", "redis://elsewhere:1/0")
    assert Settings().redis.url == "redis://127.0.0.1:6379/0"


def test_file_then_env_then_aliases(tmp_path: Path) -> None:
    cfg = tmp_path / "ctxcore.toml"
    cfg.write_text(
        '[service]\ndefault_budget = 32000\n[model]\nname = "from-file"\n[tenants.acme]\ndefault_budget = 9000\n'
    )
    env = {
        "CTXCORE_CONFIG_FILE": str(cfg),
        "CTXCORE_SERVICE__TRIGGER_RATIO": "0.8",
        "CTXCORE_MODEL": "gpt-4o",
        "CTXCORE_MODEL_BASE_URL": "http://127.0.0.1:9/v1",
        "CTXCORE_REDIS_URL": "redis://127.0.0.1:6380/2",
        "CTXCORE_TENANTS__Beta__REQUESTS_PER_SECOND": "3",
        "CTXCORE_HTTP__TOKENS": json.dumps({hash_token("secret"): "acme"}),
        "UNRELATED": "x",
    }
    s = Settings.from_env(env)
    assert s.service.default_budget == 32000 and s.service.trigger_ratio == 0.8
    assert s.model.name == "gpt-4o" and s.model.base_url == "http://127.0.0.1:9/v1" and not s.model.offline
    assert s.redis.url == "redis://127.0.0.1:6380/2"
    assert s.budget_for_tenant("acme") == 9000 and s.budget_for_tenant("other") == 32000
    assert s.tenant("Beta").requests_per_second == 3
    assert s.http.tokens == {hash_token("secret"): "acme"}


@pytest.mark.parametrize(
    ("env", "field"),
    [
        ({"CTXCORE_SERVICE__TRIGGER_RATIO": "1.5"}, "service.trigger_ratio"),
        ({"CTXCORE_SERVICE__TRIGGER_RATIO": "0.8", "CTXCORE_SERVICE__TARGET_RATIO": "0.9"}, "service"),
        ({"CTXCORE_SERVICE__NOPE": "1"}, "service.nope"),
        ({"CTXCORE_HTTP__TOKENS": '{"plaintext": "acme"}'}, "http.tokens"),
        ({"CTXCORE_TENANTS__bad:id__DEFAULT_BUDGET": "5"}, "tenants"),
        ({"CTXCORE_WORKER__SOFT_TIME_LIMIT": "200"}, "worker"),
        ({"CTXCORE_REDIS__KEY_PREFIX": "a b"}, "redis.key_prefix"),
    ],
)
def test_invalid_values_fail_fast_naming_the_field(env: dict[str, str], field: str) -> None:
    with pytest.raises(ConfigError, match=field.replace(".", r"\.")):
        Settings.from_env(env)


def test_bad_file(tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text("[service\n")
    with pytest.raises(ConfigError, match="not valid TOML"):
        Settings.from_env({}, config_file=str(bad))
    with pytest.raises(ConfigError, match="cannot read"):
        Settings.from_env({}, config_file=str(tmp_path / "missing.toml"))


def test_cluster_nodes_from_a_comma_list_or_toml_and_bad_entries_named() -> None:
    env = {"CTXCORE_REDIS__CLUSTER_NODES": "127.0.0.1:7000, 127.0.0.1:7001"}
    assert Settings.from_env(env).redis.cluster_nodes == ("127.0.0.1:7000", "127.0.0.1:7001")
    assert Settings.load({"redis": {"cluster_nodes": ["h1:7000", "[::1]:7001"]}}).redis.cluster_nodes == (
        "h1:7000",
        "[::1]:7001",
    )
    assert Settings().redis.cluster_nodes == ()
    with pytest.raises(ConfigError, match=r"redis.cluster_nodes.*'redis://h:1' is not host:port"):
        Settings.from_env({"CTXCORE_REDIS__CLUSTER_NODES": "h:1,redis://h:1"})
    with pytest.raises(ConfigError, match="scheduler_rings"):
        Settings.load({"worker": {"scheduler_rings": 0}})
