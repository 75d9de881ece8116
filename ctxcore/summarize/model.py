"""The model seam: ``ModelClient``, its result types and the machine-readable output contract.

A compressor sends a prompt (messages) *and* an ``OutputContract`` describing the output
it expects: the state-snapshot sections, or the summary blocks with their ids and token
targets. A real model reads the prompt; ``ExtractiveModel`` reads only the contract, so
prompt wording can change without breaking the offline summariser.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, Protocol, Self, runtime_checkable

from pydantic import BaseModel, ConfigDict, Field, model_validator

from ctxcore.errors import ConfigError
from ctxcore.messages import AnyMessage, Message

__all__ = ["Completion", "ContractBlock", "ModelClient", "OutputContract", "Usage"]


@dataclass(frozen=True)
class Usage:
    """Tokens and calls spent on summarisation; ``a + b`` merges two records.

    ``model`` names the model(s) involved, comma-separated when a merge mixes models.
    """

    input_tokens: int
    output_tokens: int
    total_tokens: int
    calls: int = 1
    model: str = ""

    @classmethod
    def zero(cls, model: str = "") -> Usage:
        """The neutral element: no tokens, no calls."""
        return cls(0, 0, 0, calls=0, model=model)

    def __add__(self, other: Usage) -> Usage:
        if not isinstance(other, Usage):
            return NotImplemented
        models = [m for m in (*self.model.split(","), *other.model.split(",")) if m]
        return Usage(
            self.input_tokens + other.input_tokens,
            self.output_tokens + other.output_tokens,
            self.total_tokens + other.total_tokens,
            calls=self.calls + other.calls,
            model=",".join(dict.fromkeys(models)),
        )

    def __radd__(self, other: object) -> Usage:
        # Lets ``sum(usages)`` start from the integer 0.
        if other == 0:
            return self
        return NotImplemented

    def as_dict(self) -> dict[str, int | str]:
        """A JSON-ready mapping of the fields."""
        return {
            "input_tokens": self.input_tokens,
            "output_tokens": self.output_tokens,
            "total_tokens": self.total_tokens,
            "calls": self.calls,
            "model": self.model,
        }


@dataclass(frozen=True)
class Completion:
    """The text a model returned and what the call cost."""

    text: str
    usage: Usage
    # Why the model stopped (OpenAI's ``finish_reason``: ``stop``, ``length``, ...), if it said.
    finish_reason: str | None = None


_CONTRACT_CONFIG = ConfigDict(frozen=True, extra="forbid")


class ContractBlock(BaseModel):
    """One summary block to produce: its id, its token target and the messages it covers."""

    model_config = _CONTRACT_CONFIG

    block_id: str = Field(min_length=1)
    target_tokens: int = Field(ge=1)
    source: list[Message]
    scope: str = ""


class OutputContract(BaseModel):
    """What a summarisation call must return, in machine-readable form.

    * ``kind="state_snapshot"``: one ``<state_snapshot>`` with a ``## <title>`` section per
      entry of ``sections`` (in order), summarising ``source`` within ``target_tokens``.
    * ``kind="blocks"``: JSON ``{"blocks": [{"block_id", "summary"}]}`` with exactly one
      entry per ``blocks`` item, each summary within that block's ``target_tokens``; with
      ``sections``, each summary has one ``## <title>`` per section, in order.

    ``context`` is reference-only (e.g. earlier summaries, never summarised again),
    ``instruction`` a user preservation instruction, ``query`` the latest real user request
    (what the summary must stay relevant to). Round-trips through JSON losslessly.
    """

    model_config = _CONTRACT_CONFIG

    kind: Literal["state_snapshot", "blocks"]
    sections: list[str] = Field(default_factory=list)
    source: list[Message] = Field(default_factory=list)
    target_tokens: int = 0
    blocks: list[ContractBlock] = Field(default_factory=list)
    context: list[Message] = Field(default_factory=list)
    instruction: str = ""
    query: str = ""

    @model_validator(mode="after")
    def _check_kind(self) -> Self:
        if self.kind == "state_snapshot":
            if self.target_tokens < 1:
                raise ConfigError("a state_snapshot contract needs target_tokens >= 1")
            if self.blocks:
                raise ConfigError("a state_snapshot contract takes sections and source, not blocks")
        else:
            if not self.blocks:
                raise ConfigError("a blocks contract needs at least one block")
            if self.source:
                raise ConfigError("a blocks contract carries its sources per block, not source")
            ids = [b.block_id for b in self.blocks]
            if len(set(ids)) != len(ids):
                raise ConfigError(f"block ids must be unique, got {ids}")
        return self

    @property
    def block_ids(self) -> list[str]:
        """The ids of the blocks, in order (empty for a state snapshot)."""
        return [b.block_id for b in self.blocks]


@runtime_checkable
class ModelClient(Protocol):
    """A chat model that turns messages into text: a real endpoint or an offline stand-in.

    Implementations raise ``ModelCallError`` (``ctxcore.summarize.errors``) with a
    classified ``kind`` on failure; they do not retry, the executor does.
    """

    @property
    def name(self) -> str:
        """The model name reported in usage records and provenance."""
        ...

    def complete(
        self,
        messages: Sequence[AnyMessage],
        *,
        max_tokens: int,
        contract: OutputContract | None = None,
    ) -> Completion:
        """Run one call; ``max_tokens`` caps the output, ``contract`` describes its shape."""
        ...
