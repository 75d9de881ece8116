"""One settings tree: ``ContextEngineConfig`` is built from ``Settings`` sections, and a
removed or renamed setting is refused at start-up naming what replaced it."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from ctxcore.config import EngineSettings, RecallSettings, Settings
from ctxcore.config import base as config_base
from ctxcore.config.compaction import UserMarkers
from ctxcore.engine import ContextEngine, ContextEngineConfig
from ctxcore.engine.config import CompressionRecallConfig
from ctxcore.errors import ConfigError


def test_the_engine_config_shares_the_settings_sections_not_a_copy_of_their_defaults() -> None:
    assert CompressionRecallConfig is RecallSettings
    assert issubclass(ContextEngineConfig, UserMarkers) and issubclass(EngineSettings, UserMarkers)
    for name in UserMarkers.model_fields:
        assert ContextEngineConfig.model_fields[name] is not None
        assert name not in vars(ContextEngineConfig).get("__annotations__", {}), name  # not redeclared
        assert name not in vars(EngineSettings).get("__annotations__", {}), name


def test_from_settings_builds_the_engine_config_of_a_settings_tree() -> None:
    settings = Settings.load(
        {
            "engine": {
                "internal_user_prefixes": ["[bot]"],
                "harness_structure": True,
                "tokenizer_model": "gpt-4o",
            },
            "recall": {"enabled": True, "chunk_size_tokens": 800, "chunk_overlap_tokens": 80},
        }
    )
    config = ContextEngineConfig.from_settings(settings, context_window_tokens=9000)
    assert config.internal_user_prefixes == ("[bot]",) and config.harness_structure
    assert config.model_name == "gpt-4o" and config.context_window_tokens == 9000
    assert config.compression_recall_config == settings.recall
    engine = ContextEngine(config)
    assert engine.detector == settings.engine.detector()
    assert engine.create_context("c").archive is not None  # recall on, from the tree
    with pytest.raises(ConfigError, match="'context_window_tokns'"):
        ContextEngineConfig.from_settings(settings, context_window_tokns=1)


def test_a_removed_engine_config_field_is_refused_naming_its_replacement() -> None:
    with pytest.raises(
        ConfigError, match=r"'openrouter_request_timeout': removed; .*model_context_window_tokens"
    ):
        ContextEngine({"openrouter_request_timeout": 3.0})


def test_a_removed_setting_in_a_file_or_a_variable_is_refused_naming_its_replacement(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(
        config_base.RETIRED, "service.window_cache_entries", "nothing: windows are not cached"
    )
    path = tmp_path / "ctxcore.toml"
    path.write_text("[service]\nwindow_cache_entries = 64\n", encoding="utf-8")
    expected = re.escape("service.window_cache_entries: removed setting; nothing: windows are not cached")
    with pytest.raises(ConfigError, match=expected):
        Settings.from_file(path)
    with pytest.raises(ConfigError, match=expected):
        Settings.from_env({"CTXCORE_SERVICE__WINDOW_CACHE_ENTRIES": "64"})
    with pytest.raises(ConfigError, match=r"service\.window_cach: unknown setting"):
        Settings.load({"service": {"window_cach": 1}})
