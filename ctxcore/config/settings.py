"""``Settings``, the whole tree on pydantic-settings, its loaders (``load``, ``from_file``,
``from_env``) and the list of the variables ``from_env`` reads."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from pathlib import Path
from typing import Any, get_args, get_origin

from pydantic import BaseModel, Field, ValidationError, field_validator
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict, SettingsError

from ctxcore.config.base import RETIRED
from ctxcore.config.compaction import EngineSettings, ModelSettings, RecallSettings
from ctxcore.config.service import (
    HttpSettings,
    LoggingSettings,
    ProxySettings,
    ServiceSettings,
    TenantSettings,
)
from ctxcore.config.sources import ALIASES, ENV_PREFIX, EnvironSource, SetBy, TomlFileSource, section_of
from ctxcore.config.stores import DatabaseSettings, RedisSettings
from ctxcore.config.telemetry import TelemetrySettings
from ctxcore.config.worker import FlowerSettings, WorkerSettings
from ctxcore.errors import ConfigError
from ctxcore.state.keys import validate_id

__all__ = ["Settings", "environment_variables"]

# What ``from_env``/``from_file`` asked the sources to read; unset, a constructed
# ``Settings`` reads its arguments alone (never the environment, never a file).
_ORIGIN: ContextVar[tuple[Mapping[str, str], Path | None] | None] = ContextVar(
    "ctxcore_settings_origin", default=None
)


class Settings(BaseSettings):
    """The whole configuration tree."""

    model_config = SettingsConfigDict(
        extra="forbid",
        frozen=True,
        env_prefix=ENV_PREFIX,
        env_nested_delimiter="__",
        env_parse_none_str="null",
        # As every other section: defaults are trusted, not validated at each construction.
        validate_default=False,
    )
    redis: RedisSettings = Field(default_factory=RedisSettings)
    database: DatabaseSettings = Field(default_factory=DatabaseSettings)
    model: ModelSettings = Field(default_factory=ModelSettings)
    engine: EngineSettings = Field(default_factory=EngineSettings)
    service: ServiceSettings = Field(default_factory=ServiceSettings)
    http: HttpSettings = Field(default_factory=HttpSettings)
    tenants: dict[str, TenantSettings] = Field(default_factory=dict)
    worker: WorkerSettings = Field(default_factory=WorkerSettings)
    recall: RecallSettings = Field(default_factory=RecallSettings)
    proxy: ProxySettings = Field(default_factory=ProxySettings)
    logging: LoggingSettings = Field(default_factory=LoggingSettings)
    flower: FlowerSettings = Field(default_factory=FlowerSettings)
    telemetry: TelemetrySettings = Field(default_factory=TelemetrySettings)

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        origin = _ORIGIN.get()
        if origin is None:
            return (init_settings,)
        environ, path = origin
        sources: list[PydanticBaseSettingsSource] = [init_settings, EnvironSource(settings_cls, environ)]
        if path is not None:
            sources.append(TomlFileSource(settings_cls, path))  # lowest: variables override it
        return tuple(sources)

    @field_validator("tenants")
    @classmethod
    def _tenant_ids(cls, value: dict[str, TenantSettings]) -> dict[str, TenantSettings]:
        for tenant in value:
            validate_id(tenant, "tenant_id")
        return value

    def tenant(self, tenant_id: str) -> TenantSettings:
        """Overrides of one tenant (empty when none are configured)."""
        return self.tenants.get(tenant_id) or TenantSettings()

    def recall_for_tenant(self, tenant_id: str) -> RecallSettings:
        """A tenant's recall settings (its own section, else the global one)."""
        return self.tenant(tenant_id).recall or self.recall

    def model_for_tenant(self, tenant_id: str) -> ModelSettings:
        """The model a tenant's conversations are summarised with."""
        return self.tenant(tenant_id).model or self.model

    def proxy_for_tenant(self, tenant_id: str) -> ProxySettings:
        """The proxy settings of a tenant's requests (its own section, else the global one)."""
        return self.tenant(tenant_id).proxy or self.proxy

    def budget_for_tenant(self, tenant_id: str) -> int:
        """A tenant's default budget."""
        return self.tenant(tenant_id).default_budget or self.service.default_budget

    @classmethod
    def load(cls, data: Mapping[str, Any]) -> Settings:
        """Validate a mapping; errors become ``ConfigError`` naming every bad field."""
        with _config_errors():
            return cls.model_validate(dict(data))

    @classmethod
    def from_file(cls, path: str | os.PathLike[str]) -> Settings:
        """Settings from a TOML file alone."""
        return cls._from_sources({}, Path(path))

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, config_file: str | None = None) -> Settings:
        """Settings from the TOML file (``config_file``, else ``CTXCORE_CONFIG_FILE``, else
        none) overlaid with the ``CTXCORE_*`` variables of ``environ`` (default ``os.environ``)."""
        env = os.environ if environ is None else environ
        path = config_file or env.get("CTXCORE_CONFIG_FILE")
        return cls._from_sources(env, Path(path) if path else None)

    @classmethod
    def _from_sources(cls, environ: Mapping[str, str], path: Path | None) -> Settings:
        token = _ORIGIN.set((environ, path))
        try:
            with _config_errors():
                return cls()
        finally:
            _ORIGIN.reset(token)


@contextmanager
def _config_errors() -> Iterator[None]:
    """Validation and source errors as one ``ConfigError`` naming every bad field."""
    try:
        yield
    except ValidationError as exc:
        raise ConfigError(f"invalid settings: {'; '.join(_problem(err) for err in exc.errors())}") from exc
    except SettingsError as exc:
        raise ConfigError(f"invalid settings: {exc}") from exc


def _problem(err: Any) -> str:
    where = ".".join(str(p) for p in err["loc"])
    if err["type"] == "extra_forbidden":
        origin = f" (from {err['input']})" if isinstance(err.get("input"), SetBy) else ""
        if where in RETIRED:
            return f"{where}: removed setting{origin}; {RETIRED[where]}"
        return f"{where}: unknown setting{origin}; `ctxcore --help` lists them all"
    return f"{where}: {err['msg']}"


def environment_variables() -> list[tuple[str, str]]:
    """Every ``CTXCORE_*`` variable ``from_env`` reads, with its default as shown to a user:
    each leaf of the ``Settings`` tree as ``CTXCORE_<SECTION>__<KEY>`` (``<ID>`` stands for a
    tenant id; a tenant's null values and missing ``MODEL__*`` keys mean the global settings
    apply), then the short aliases and ``CTXCORE_CONFIG_FILE``. Generated from the model, so
    ``--help`` cannot drift from it."""
    out: list[tuple[str, str]] = []
    _leaves(Settings, ENV_PREFIX.rstrip("_"), out)
    for alias, path in ALIASES.items():
        out.append((alias, f"alias of {ENV_PREFIX}{'__'.join(path).upper()}"))
    out.append(("CTXCORE_CONFIG_FILE", "TOML settings file read before the variables (default: none)"))
    return out


def _leaves(model: type[BaseModel], name: str, out: list[tuple[str, str]]) -> None:
    for field_name, info in model.model_fields.items():
        path = f"{name}{'_' if name == ENV_PREFIX.rstrip('_') else '__'}{field_name.upper()}"
        args = get_args(info.annotation)
        if get_origin(info.annotation) is dict and len(args) == 2 and section_of(args[1]):
            _leaves(section_of(args[1]) or model, f"{path}__<ID>", out)
        elif section := section_of(info.annotation):
            _leaves(section, path, out)
        else:
            default = info.get_default(call_default_factory=True)
            out.append((path, default if isinstance(default, str) else json.dumps(default)))
