"""What every settings section shares: strict, frozen models; token hashing."""

from __future__ import annotations

import hashlib

from pydantic import ConfigDict

__all__ = ["STRICT", "hash_token"]

STRICT = ConfigDict(extra="forbid", frozen=True)
"""Every settings section's model config: unknown keys refused, values frozen."""


def hash_token(token: str) -> str:
    """sha256 hex of a bearer token: only hashes are configured or stored."""
    return hashlib.sha256(token.encode("utf-8")).hexdigest()
