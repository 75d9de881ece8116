"""What every settings section shares: strict, frozen models; the settings that are gone and
what replaced them; the strict validation every config (engine, processors) goes through;
token hashing.

Deviation from spec section 0: configs reject unknown keys (``extra="forbid"``) instead of
silently ignoring them, so a misspelt threshold fails at ``create_context`` rather than
leaving a processor at its default. Every problem becomes one ``ConfigError`` naming the
component, the field and the reason.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import Any, TypeVar

from pydantic import BaseModel, ConfigDict, ValidationError

from ctxcore.errors import ConfigError

__all__ = ["RETIRED", "STRICT", "StrictConfig", "hash_token", "validate_config"]

STRICT = ConfigDict(extra="forbid", frozen=True)
"""Every settings section's model config: unknown keys refused, values frozen."""

RETIRED: dict[str, str] = {
    # ContextEngineConfig's reference fields (spec 2.2): ctxcore never looks a model's window
    # up over the network.
    "enable_openrouter_model_context_window_tokens": "set model_context_window_tokens (or "
    "context_window_tokens) instead: ctxcore never looks a model's window up over the network",
    "openrouter_request_timeout": "nothing replaces it: ctxcore never looks a model's window up "
    "over the network (set model_context_window_tokens)",
}
"""Removed or renamed settings (a ``Settings`` key as ``section.key``, a config's field by
name) -> what to set instead. Still refused, as every unknown key is, but the error names the
replacement."""


def hash_token(token: str) -> str:
    """sha256 hex of a bearer token: only hashes are configured or stored."""
    return hashlib.sha256(token.encode("utf-8")).hexdigest()


M = TypeVar("M", bound=BaseModel)


class StrictConfig(BaseModel):
    """Base of every ctxcore config model: immutable, unknown keys rejected."""

    model_config = STRICT


def _describe(error: Mapping[str, Any]) -> str:
    loc = ".".join(str(part) for part in error.get("loc", ()))
    kind = error.get("type", "")
    reason = error.get("msg", "")
    if kind == "extra_forbidden":
        reason = (
            f"removed; {RETIRED[loc]}" if loc in RETIRED else "unknown field (not accepted by this config)"
        )
    if not loc:
        return str(reason).removeprefix("Value error, ")
    shown = "" if kind == "extra_forbidden" else f" (got {error.get('input')!r})"
    return f"field {loc!r}: {reason}{shown}"


def validate_config(model: type[M], raw: M | Mapping[str, Any] | None, component: str) -> M:
    """Build ``model`` from an instance, a plain dict of its fields, or None (defaults).

    Raises:
        ConfigError: naming ``component``, each offending field and the reason.
    """
    if raw is None:
        raw = {}
    if isinstance(raw, model):
        return raw
    if isinstance(raw, BaseModel):
        raise ConfigError(
            f"{component}: expected a {model.__name__} or a dict of its fields, got {type(raw).__name__}"
        )
    if not isinstance(raw, Mapping):
        raise ConfigError(
            f"{component}: config must be a {model.__name__} or a dict, got {type(raw).__name__}"
        )
    try:
        return model.model_validate(dict(raw))
    except ValidationError as exc:
        details = "; ".join(_describe(e) for e in exc.errors())
        raise ConfigError(f"{component}: invalid config: {details}") from exc
