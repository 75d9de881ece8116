"""The two kinds of body the API's models are: requests refuse unknown keys (a typo is an
error, not a silently ignored option), responses ignore them (a newer server may add fields)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

__all__ = ["RequestBody", "ResponseBody"]


class RequestBody(BaseModel):
    """A request body: unknown keys are refused."""

    model_config = ConfigDict(extra="forbid")


class ResponseBody(BaseModel):
    """A response body: unknown keys are ignored."""

    model_config = ConfigDict(extra="ignore")
