"""Reading settings sources: the TOML file, and ``CTXCORE_*`` names and values (parsed as JSON
when they parse) set into the nested mapping."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path
from typing import Any

from ctxcore.errors import ConfigError

__all__ = ["ENV_PREFIX"]

ENV_PREFIX = "CTXCORE_"
_ALIASES = {
    "CTXCORE_REDIS_URL": ("redis", "url"),
    "CTXCORE_BROKER_URL": ("worker", "broker_url"),
    "CTXCORE_MODEL_BASE_URL": ("model", "base_url"),
    "CTXCORE_MODEL": ("model", "name"),
}


def _read_toml(path: Path) -> dict[str, Any]:
    try:
        with path.open("rb") as fh:
            return tomllib.load(fh)
    except OSError as exc:
        raise ConfigError(f"cannot read config file {path}: {exc}") from exc
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"config file {path} is not valid TOML: {exc}") from exc


def _parse(value: str) -> Any:
    try:
        return json.loads(value)
    except (json.JSONDecodeError, ValueError):
        return value


def _set(data: dict[str, Any], path: tuple[str, ...], value: str) -> None:
    node = data
    for part in path[:-1]:
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            raise ConfigError(f"environment sets {'.'.join(path)} but {part} is not a section")
        node = child
    node[path[-1]] = _parse(value)
