"""``Settings``: the one configuration tree of the service, validated at construction.

``Settings`` is a pydantic-settings ``BaseSettings``. Sources, lowest precedence first:
defaults, a TOML file (``--config`` or ``CTXCORE_CONFIG_FILE``), environment variables
``CTXCORE_<SECTION>__<KEY>`` (nested keys joined by ``__``; lists, maps and whole sections as
JSON, e.g. ``CTXCORE_HTTP__TOKENS='{...}'`` or ``CTXCORE_SERVICE='{...}'``; ``null`` is None)
plus the short aliases ``CTXCORE_REDIS_URL``, ``CTXCORE_BROKER_URL``, ``CTXCORE_MODEL_BASE_URL``
and ``CTXCORE_MODEL``. A variable setting a map (``HTTP__TOKENS``) replaces the file's map;
sections merge key by key. Tenant ids keep their case (``CTXCORE_TENANTS__Acme__…`` is tenant
``Acme``, not ``acme``). Unknown keys and sections, in the file or the variables, are errors.
Only ``Settings.from_env()`` reads the environment; a constructed ``Settings`` never does.

Layout: ``base`` (shared model config, ``hash_token``), a module per group of sections
(``stores``, ``compaction``, ``service``, ``worker``), ``sources`` (the TOML and variable
sources) and ``settings`` (the tree and ``from_env``); this package re-exports them.
"""

from __future__ import annotations

from ctxcore.config.base import hash_token
from ctxcore.config.compaction import EngineSettings, ModelSettings, RecallSettings
from ctxcore.config.service import (
    HttpSettings,
    LoggingSettings,
    ProxySettings,
    ServiceSettings,
    TenantSettings,
)
from ctxcore.config.settings import Settings, environment_variables
from ctxcore.config.stores import DatabaseSettings, RedisSettings
from ctxcore.config.telemetry import TelemetrySettings
from ctxcore.config.worker import FlowerSettings, WorkerSettings

__all__ = [
    "DatabaseSettings",
    "EngineSettings",
    "FlowerSettings",
    "HttpSettings",
    "LoggingSettings",
    "ModelSettings",
    "ProxySettings",
    "RecallSettings",
    "RedisSettings",
    "ServiceSettings",
    "Settings",
    "TelemetrySettings",
    "TenantSettings",
    "WorkerSettings",
    "environment_variables",
    "hash_token",
]
