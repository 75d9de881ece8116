"""What every settings section shares: strict, frozen models; token hashing."""

from __future__ import annotations

import hashlib

from pydantic import ConfigDict

__all__ = ["hash_token"]

_STRICT = ConfigDict(extra="forbid", frozen=True)


def hash_token(token: str) -> str:
    """sha256 hex of a bearer token: only hashes are configured or stored."""
    return hashlib.sha256(token.encode("utf-8")).hexdigest()
