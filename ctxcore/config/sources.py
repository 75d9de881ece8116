"""The two pydantic-settings sources ``Settings.from_env`` layers: ``CTXCORE_*`` variables
from the mapping it is given, over a TOML file.

Each differs from its library parent only where ctxcore's contract asks it to:

* ``EnvironSource`` reads the mapping it is given (not ``os.environ``: tests pass a dict),
  maps the short aliases, keeps tenant ids' case (the library lower-cases every name when
  matching case-insensitively, which would turn ``CTXCORE_TENANTS__Acme__…`` into tenant
  ``acme``), keeps a value that does not parse as JSON as the string it is (a comma list of
  cluster nodes, or a bad value for the field's validator to name) and hands an unknown
  section to validation, so it fails like an unknown TOML key.
* ``TomlFileSource`` fails on a missing or malformed file (the library skips a missing one),
  and gives way to a variable that sets a whole dict-valued leaf (``CTXCORE_HTTP__TOKENS``
  replaces the file's token map: the library would merge the two, keeping a token the
  variable meant to drop).
"""

from __future__ import annotations

import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any, get_args, get_origin

from pydantic import BaseModel
from pydantic.fields import FieldInfo
from pydantic_settings import BaseSettings, EnvSettingsSource, TomlConfigSettingsSource
from pydantic_settings.sources.utils import parse_env_vars

from ctxcore.errors import ConfigError

__all__ = ["ALIASES", "ENV_PREFIX", "EnvironSource", "SetBy", "TomlFileSource", "section_of"]

ENV_PREFIX = "CTXCORE_"
# Short names of the most used variables; the full CTXCORE_<SECTION>__<KEY> wins over its alias.
ALIASES = {
    "CTXCORE_REDIS_URL": ("redis", "url"),
    "CTXCORE_BROKER_URL": ("worker", "broker_url"),
    "CTXCORE_MODEL_BASE_URL": ("model", "base_url"),
    "CTXCORE_MODEL": ("model", "name"),
    # The standard OpenTelemetry variable: validated (and turning traces on) like the setting.
    "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": ("telemetry", "otlp_endpoint"),
}
_DELIMITER = "__"
# The dict-valued sections whose keys are ids, not field names: their case is kept.
_ID_KEYED = ("tenants",)


class EnvironSource(EnvSettingsSource):
    """``CTXCORE_<SECTION>__<KEY>`` variables (and the aliases) of ``environ``."""

    def __init__(self, settings_cls: type[BaseSettings], environ: Mapping[str, str]) -> None:
        self._environ = environ
        self._unknown: dict[str, str] = {}
        super().__init__(settings_cls)

    def _load_env_vars(self) -> Mapping[str, str | None]:
        fields = self.settings_cls.model_fields
        aliased: dict[str, str] = {}
        canonical: dict[str, str] = {}
        for name, value in self._environ.items():
            if name in ALIASES:
                aliased[ENV_PREFIX.lower() + _DELIMITER.join(ALIASES[name])] = value
                continue
            if not name.upper().startswith(ENV_PREFIX):
                continue
            parts = name[len(ENV_PREFIX) :].split(_DELIMITER)
            section = parts[0].lower()
            if section not in fields:
                if len(parts) > 1:  # CTXCORE_CONFIG_FILE and other single names are not settings
                    self._unknown.setdefault(section, name)
                continue
            # Names match case-insensitively, so lower-case them here, all but a tenant id.
            key = [p if section in _ID_KEYED and i == 1 else p.lower() for i, p in enumerate(parts)]
            canonical[ENV_PREFIX.lower() + _DELIMITER.join(key)] = value
        # Case-sensitive from here on: the names are normalised above, ids included.
        return parse_env_vars(aliased | canonical, True, self.env_ignore_empty, self.env_parse_none_str)

    def decode_complex_value(self, field_name: str, field: FieldInfo, value: Any) -> Any:
        # Not JSON: the string itself, for the field's validator (which names the field) to
        # take (a comma list) or refuse; the library would raise an error naming no field.
        try:
            return super().decode_complex_value(field_name, field, value)
        except ValueError:
            return value

    def __call__(self) -> dict[str, Any]:
        data = super().__call__()
        for section, name in self._unknown.items():
            # Validation names it as an unknown key, like a TOML table of that name.
            data[section] = SetBy(name)
        return data


class SetBy(str):
    """The value given to validation for an unknown section: the variable that set it."""


class TomlFileSource(TomlConfigSettingsSource):
    """One TOML file, which must exist and parse."""

    def __init__(self, settings_cls: type[BaseSettings], path: Path) -> None:
        super().__init__(settings_cls, toml_file=path)

    def _read_files(self, files: Any, deep_merge: bool = False) -> dict[str, Any]:
        return self._read_file(Path(files))

    def _read_file(self, file_path: Any) -> dict[str, Any]:
        try:
            with Path(file_path).open("rb") as fh:
                return tomllib.load(fh)
        except OSError as exc:
            raise ConfigError(f"cannot read config file {file_path}: {exc}") from exc
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"config file {file_path} is not valid TOML: {exc}") from exc

    def __call__(self) -> dict[str, Any]:
        data = super().__call__()
        _drop_replaced(data, self.current_state, self.settings_cls)
        return data


def _drop_replaced(lower: dict[str, Any], higher: Mapping[str, Any], model: type[BaseModel]) -> None:
    """Remove from ``lower`` each dict-valued leaf (not a section) that ``higher`` sets, so the
    library's deep merge replaces it instead of merging the two maps."""
    for key, value in higher.items():
        field = model.model_fields.get(key)
        below = lower.get(key)
        if field is None or not isinstance(value, Mapping) or not isinstance(below, dict):
            continue
        if section := section_of(field.annotation):
            _drop_replaced(below, value, section)
        elif (entry := _id_keyed_section(field)) is not None:
            for entry_id, entry_value in value.items():
                if isinstance(entry_value, Mapping) and isinstance(below.get(entry_id), dict):
                    _drop_replaced(below[entry_id], entry_value, entry)
        else:
            del lower[key]


def _id_keyed_section(field: FieldInfo) -> type[BaseModel] | None:
    """The section type of a ``dict[str, Section]`` field (tenants), else None."""
    args = get_args(field.annotation)
    if get_origin(field.annotation) is dict and len(args) == 2:
        return section_of(args[1])
    return None


def section_of(annotation: Any) -> type[BaseModel] | None:
    """The settings section an annotation holds (``X`` or ``X | None``), else None (a
    ``dict[str, X]`` is a map of sections, not one)."""
    if get_origin(annotation) is dict:
        return None
    for candidate in (annotation, *get_args(annotation)):
        if isinstance(candidate, type) and issubclass(candidate, BaseModel):
            return candidate
    return None
