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


def test_tenant_ids_keep_their_case_and_differ_by_it() -> None:
    # pydantic-settings lower-cases names when matching case-insensitively: ids must not be.
    s = Settings.from_env(
        {
            "CTXCORE_TENANTS__Acme__DEFAULT_BUDGET": "5000",
            "CTXCORE_TENANTS__acme__DEFAULT_BUDGET": "7000",
            "CTXCORE_TENANTS__Acme__MODEL__NAME": "m-acme",
        }
    )
    assert set(s.tenants) == {"Acme", "acme"}
    assert s.budget_for_tenant("Acme") == 5000 and s.budget_for_tenant("acme") == 7000
    assert s.model_for_tenant("Acme").name == "m-acme" and s.model_for_tenant("acme").name == "gpt-4o-mini"


def test_unknown_keys_and_sections_are_named(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as raised:
        Settings.from_env(
            {"CTXCORE_NOPE__X": "1", "CTXCORE_SERVICE__BOGUS": "2", "CTXCORE_TENANTS__a__NOPE": "3"}
        )
    message = str(raised.value)
    assert "nope: unknown setting (from CTXCORE_NOPE__X)" in message
    assert "service.bogus: unknown setting" in message and "tenants.a.nope: unknown setting" in message
    cfg = tmp_path / "ctxcore.toml"
    cfg.write_text("[service]\ndefault_budget = 1000\nbudjet = 1\n[nope]\nx = 1\n")
    with pytest.raises(ConfigError, match=r"service\.budjet: unknown setting.*nope: unknown setting"):
        Settings.from_file(cfg)
    with pytest.raises(ConfigError, match=r"service\.budjet"):
        Settings.load({"service": {"budjet": 1}})
    # Single names that are no section (the file variable, the test servers') are not settings.
    assert (
        Settings.from_env({"CTXCORE_CONFIG_FILE_X": "1", "CTXCORE_TEST_REDIS_URL": "redis://h:1/0"})
        == Settings()
    )


def test_a_variable_setting_a_map_replaces_the_files_map_and_sections_merge(tmp_path: Path) -> None:
    cfg = tmp_path / "ctxcore.toml"
    cfg.write_text(
        f'[http]\nport = 9000\n[http.tokens]\n"{hash_token("revoked")}" = "acme"\n'
        "[proxy.context_window_tokens]\nm1 = 1000\n[tenants.Acme]\ndefault_budget = 9000\n"
    )
    s = Settings.from_env(
        {
            "CTXCORE_HTTP__TOKENS": json.dumps({hash_token("new"): "acme"}),
            "CTXCORE_HTTP__BURST": "7",
            "CTXCORE_TENANTS__Acme__REQUESTS_PER_SECOND": "3",
        },
        config_file=str(cfg),
    )
    assert s.http.tokens == {hash_token("new"): "acme"}  # the revoked token is gone
    assert s.http.port == 9000 and s.http.burst == 7
    assert s.proxy.context_window_tokens == {"m1": 1000}
    assert s.tenant("Acme").default_budget == 9000 and s.tenant("Acme").requests_per_second == 3


def test_values_json_null_aliases_and_precedence() -> None:
    s = Settings.from_env(
        {
            "CTXCORE_DATABASE__URL": "null",
            "CTXCORE_WORKER__RETRY_DELAYS": "[1, 2.5]",
            "CTXCORE_ENGINE__HARNESS_STRUCTURE": "true",
            "CTXCORE_MODEL": "from-alias",
            "CTXCORE_MODEL__NAME": "from-full-name",
            "CTXCORE_BROKER_URL": "amqp://u:p@h:5672//",
            "CTXCORE_SERVICE": '{"default_budget": 7700}',
        }
    )
    assert s.database.url is None and s.worker.retry_delays == (1.0, 2.5) and s.engine.harness_structure
    assert s.model.name == "from-full-name"  # the full name wins over its alias
    assert s.worker.broker_url == "amqp://u:p@h:5672//" and s.service.default_budget == 7700
    with pytest.raises(ConfigError) as raised:
        Settings.from_env({"CTXCORE_HTTP__TOKENS": "not json", "CTXCORE_HTTP__PORT": "abc"})
    assert "http.tokens" in str(raised.value) and "http.port" in str(raised.value)  # every bad field


def test_the_environ_given_is_read_not_the_process_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CTXCORE_SERVICE__DEFAULT_BUDGET", "5500")
    assert Settings.from_env({}).service.default_budget == 128_000
    assert Settings.from_env().service.default_budget == 5500
    assert Settings().service.default_budget == 128_000


def test_a_tenants_map_set_by_a_variable_replaces_the_files_too(tmp_path: Path) -> None:
    cfg = tmp_path / "ctxcore.toml"
    cfg.write_text(
        "[tenants.Acme]\ndefault_budget = 9000\n[tenants.Acme.proxy.context_window_tokens]\nold = 1000\n"
    )
    s = Settings.from_env(
        {"CTXCORE_TENANTS__Acme__PROXY__CONTEXT_WINDOW_TOKENS": '{"new": 2000}'}, config_file=str(cfg)
    )
    proxy = s.proxy_for_tenant("Acme")
    assert proxy.context_window_tokens == {"new": 2000} and s.tenant("Acme").default_budget == 9000
