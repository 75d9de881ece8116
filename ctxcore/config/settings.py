"""``Settings``, the whole tree, its loaders (``load``, ``from_file``, ``from_env``) and the
list of the variables ``from_env`` reads."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field, ValidationError, field_validator

from ctxcore.config.base import _STRICT
from ctxcore.config.compaction import EngineSettings, ModelSettings, RecallSettings
from ctxcore.config.loading import _ALIASES, ENV_PREFIX, _read_toml, _set
from ctxcore.config.service import HttpSettings, ProxySettings, ServiceSettings, TenantSettings
from ctxcore.config.stores import DatabaseSettings, RedisSettings
from ctxcore.config.worker import WorkerSettings
from ctxcore.errors import ConfigError
from ctxcore.state.keys import validate_id

__all__ = ["Settings", "environment_variables"]


class Settings(BaseModel):
    """The whole configuration tree."""

    model_config = _STRICT
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
        try:
            return cls.model_validate(dict(data))
        except ValidationError as exc:
            problems = "; ".join(
                f"{'.'.join(str(p) for p in err['loc'])}: {err['msg']}" for err in exc.errors()
            )
            raise ConfigError(f"invalid settings: {problems}") from exc

    @classmethod
    def from_file(cls, path: str | os.PathLike[str]) -> Settings:
        """Settings from a TOML file alone."""
        return cls.load(_read_toml(Path(path)))

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, config_file: str | None = None) -> Settings:
        """Settings from the TOML file (if any) overlaid with ``CTXCORE_*`` variables."""
        env = os.environ if environ is None else environ
        path = config_file or env.get("CTXCORE_CONFIG_FILE")
        data: dict[str, Any] = _read_toml(Path(path)) if path else {}
        for name, value in sorted(env.items()):
            if name in _ALIASES:
                _set(data, _ALIASES[name], value)
            elif name.startswith(ENV_PREFIX) and "__" in name:
                parts = tuple(p.lower() for p in name[len(ENV_PREFIX) :].split("__"))
                if parts[0] == "tenants" and len(parts) >= 2:
                    # Tenant ids keep their case.
                    raw = name[len(ENV_PREFIX) :].split("__")
                    parts = ("tenants", raw[1], *(p.lower() for p in raw[2:]))
                _set(data, parts, value)
        return cls.load(data)


def environment_variables() -> list[tuple[str, str]]:
    """Every ``CTXCORE_*`` variable ``from_env`` reads, with its default as shown to a user:
    each leaf of the ``Settings`` tree as ``CTXCORE_<SECTION>__<KEY>`` (``<ID>`` stands for a
    tenant id; a tenant's null values and missing ``MODEL__*`` keys mean the global settings
    apply), then the short aliases and ``CTXCORE_CONFIG_FILE``. Generated from the model, so
    ``--help`` cannot drift from it."""
    out: list[tuple[str, str]] = []
    _leaves(Settings, ENV_PREFIX.rstrip("_"), out)
    for alias, path in _ALIASES.items():
        out.append((alias, f"alias of {ENV_PREFIX}{'__'.join(path).upper()}"))
    out.append(("CTXCORE_CONFIG_FILE", "TOML settings file read before the variables (default: none)"))
    return out


def _leaves(model: type[BaseModel], name: str, out: list[tuple[str, str]]) -> None:
    for field_name, info in model.model_fields.items():
        path = f"{name}{'_' if name == ENV_PREFIX.rstrip('_') else '__'}{field_name.upper()}"
        args: tuple[Any, ...] = getattr(info.annotation, "__args__", ())
        if getattr(info.annotation, "__origin__", None) is dict and len(args) == 2 and _model_of(args[1]):
            _leaves(_model_of(args[1]) or model, f"{path}__<ID>", out)
        elif section := _model_of(info.annotation):
            _leaves(section, path, out)
        else:
            default = info.get_default(call_default_factory=True)
            out.append((path, default if isinstance(default, str) else json.dumps(default)))


def _model_of(annotation: Any) -> type[BaseModel] | None:
    """The settings section an annotation holds (``X`` or ``X | None``), else None."""
    for candidate in (annotation, *getattr(annotation, "__args__", ())):
        if isinstance(candidate, type) and issubclass(candidate, BaseModel):
            return candidate
    return None
