"""What every settings section shares: strict, frozen models; the settings that are gone and
what replaced them; token hashing."""

from __future__ import annotations

import hashlib

from pydantic import ConfigDict

__all__ = ["RETIRED", "STRICT", "hash_token"]

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
