"""The model seam: Usage arithmetic, the output contract's validation and JSON round trip."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from ctxcore.messages import AssistantMessage, ToolCall, ToolMessage, UserMessage
from ctxcore.summarize import (
    Completion,
    ContractBlock,
    ExtractiveModel,
    ModelClient,
    OpenAIChatModel,
    OutputContract,
    Usage,
)


def test_usage_addition_merges_everything() -> None:
    a = Usage(10, 5, 15, model="m1")
    b = Usage(1, 2, 3, calls=2, model="m2")
    total = a + b + Usage(0, 0, 0, model="m1")
    assert (total.input_tokens, total.output_tokens, total.total_tokens, total.calls) == (11, 7, 18, 4)
    assert total.model == "m1,m2"
    assert sum([a, b]) == a + b
    assert Usage.zero() + a == a
    assert a.as_dict()["total_tokens"] == 15


def test_completion_is_a_value() -> None:
    assert Completion("x", Usage(1, 1, 2)) == Completion("x", Usage(1, 1, 2))


def test_contract_round_trips_through_json() -> None:
    source = [
        UserMessage(content="fix the bug", context_message_id="0001"),
        AssistantMessage(
            content="", tool_calls=[ToolCall(id="c1", name="read", arguments='{"path": "a.py"}')]
        ),
        ToolMessage(tool_call_id="c1", content="print(1)", metadata={"is_error": False}),
    ]
    snapshot = OutputContract(
        kind="state_snapshot",
        sections=["Active Task", "Critical Context"],
        source=source,
        target_tokens=300,
        context=[UserMessage(content="<memory_block_round>old</memory_block_round>")],
        instruction="keep SQL",
        query="fix the bug",
    )
    assert OutputContract.model_validate_json(snapshot.model_dump_json()) == snapshot
    blocks = OutputContract(
        kind="blocks",
        blocks=[
            ContractBlock(block_id="b1", target_tokens=50, source=source[:1], scope="round"),
            ContractBlock(block_id="b2", target_tokens=60, source=source[1:]),
        ],
    )
    again = OutputContract.model_validate_json(blocks.model_dump_json())
    assert again == blocks and again.block_ids == ["b1", "b2"]
    assert isinstance(again.blocks[1].source[1], ToolMessage)


@pytest.mark.parametrize(
    "fields",
    [
        {"kind": "state_snapshot", "sections": ["A"], "target_tokens": 0},
        {
            "kind": "state_snapshot",
            "target_tokens": 10,
            "blocks": [{"block_id": "x", "target_tokens": 1, "source": []}],
        },
        {"kind": "blocks"},
        {"kind": "blocks", "blocks": [{"block_id": "x", "target_tokens": 5, "source": []}] * 2},
        {
            "kind": "blocks",
            "source": [{"role": "user", "content": "a source belongs to a block"}],
            "blocks": [{"block_id": "x", "target_tokens": 5, "source": []}],
        },
        {"kind": "blocks", "blocks": [{"block_id": "", "target_tokens": 5, "source": []}]},
        {"kind": "blocks", "blocks": [{"block_id": "x", "target_tokens": 0, "source": []}]},
        {"kind": "summary", "target_tokens": 5},
        {"kind": "state_snapshot", "target_tokens": 5, "surprise": 1},
    ],
)
def test_invalid_contracts_are_rejected(fields: dict[str, object]) -> None:
    with pytest.raises(ValidationError):
        OutputContract.model_validate(fields)


def test_a_blocks_contract_takes_sections() -> None:
    contract = OutputContract.model_validate(
        {
            "kind": "blocks",
            "sections": ["Task state", "Next steps"],
            "blocks": [{"block_id": "x", "target_tokens": 5, "source": []}],
        }
    )
    assert contract.sections == ["Task state", "Next steps"]
    assert OutputContract.model_validate_json(contract.model_dump_json()) == contract


def test_clients_satisfy_the_protocol() -> None:
    assert isinstance(ExtractiveModel(), ModelClient)
    model = OpenAIChatModel("http://127.0.0.1:9/v1", model="m")
    try:
        assert isinstance(model, ModelClient) and model.name == "m"
    finally:
        model.close()
