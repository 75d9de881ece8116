"""The eval's readability figures, from the documented block formats (issue 16, item 9)."""

from __future__ import annotations

import json

from ctxcore.eval.readability import pooled, readability
from ctxcore.eval.report import summary_columns
from ctxcore.messages import AssistantMessage, ToolCall, ToolMessage, UserMessage

HISTORY = [
    UserMessage(content="Please fix the parser in /testbed/django/db/models.py today"),
    AssistantMessage(
        content="Reading it first.",
        tool_calls=[ToolCall(id="c1", name="bash", arguments=json.dumps({"command": "cat models.py"}))],
    ),
    ToolMessage(tool_call_id="c1", content="class Model:\n    pass"),
]

LEGACY = (
    "[ROUND_LEVEL_MEMORY_BLOCK]\nprocessor: RoundLevelCompressor\nscope: s\n\nSummary:\n"
    "## Task state\n"
    "- user: Please fix the parser … today\n"  # tagged, whole words around the elision
    '- tool bash: command="cat models.py" -> class Model:\n'
    "## Files and changes\n(none)\n"
    "- assistant: Reading it   first.\n"
    "- user: Reading it first.\n"  # the same line again (tag and spacing ignored)
    'File "/testbed/d…\n'  # untagged, cut inside a word
    "   \n"
    "[[COMPRESSION_RECALL: id=x]]"
)
FORKED = (
    "<memory_block_current>\n<meaning>not a request</meaning>\n<summary>\n<state_snapshot>\n"
    "## Active Task\n- user: Please fix the parser\n## Critical Context\n(none)\n</state_snapshot>\n"
    "</summary>\n</memory_block_current>"
)


def test_counts_over_the_summary_blocks_of_a_window() -> None:
    window = [
        UserMessage(content=LEGACY),
        UserMessage(content=FORKED),
        UserMessage(content="- user: not a block, a plain message"),
        AssistantMessage(content="Summary:\n- assistant: not a block either"),
    ]
    figures = readability(window, HISTORY).as_dict()
    assert figures == {
        "summary_blocks": 2,
        "summary_lines": 6,
        "tagged_lines": 5,
        "duplicate_lines": 1,
        "midword_cuts": 1,
    }


def test_a_word_the_conversation_never_had_is_a_cut() -> None:
    block = "[ROUND_LEVEL_MEMORY_BLOCK]\n\nSummary:\n- user: Please fix the pars\n- user: fix … parse"
    figures = readability([UserMessage(content=block)], HISTORY)
    assert figures.lines == 2 and figures.cuts == 2


def test_pooled_figures_and_report_columns() -> None:
    records = [readability([UserMessage(content=LEGACY)], HISTORY).as_dict(), {}]
    figures = pooled(records)
    assert figures["summary_lines"] == 5 and figures["tagged_share"] == 0.8
    columns = summary_columns({"readability": figures})
    assert (columns["sum_lines"], columns["tagged"], columns["dup_lines"], columns["cuts"]) == (
        "5",
        "0.80",
        "1",
        "1",
    )
    assert "sum_lines" not in summary_columns({"readability": pooled([])})
