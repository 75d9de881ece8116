"""The extractive summariser keeps content in the line it came from: whole commands, the
agent's own lists, code lines with their numbers, printed values, located errors, and the
working set of the newest messages first."""

from __future__ import annotations

import json
from collections.abc import Sequence

import pytest

from ctxcore.messages import AnyMessage, AssistantMessage, ToolCall, ToolMessage, UserMessage
from ctxcore.summarize import ContractBlock, ExtractiveModel, OutputContract
from ctxcore.summarize.extractive.tools import COMMAND_CHARS, command_text, result_line
from ctxcore.summarize.prompts import BLOCK_SECTIONS
from ctxcore.tokens import TiktokenCounter

SED = "sed -i '1261s/old_name/new_name/;1722s/a_b/c_d/;3342s/x1/y1/;700d;708d' django/db/models/base.py"


def bash(cid: str, command: str, text: str = "") -> AssistantMessage:
    return AssistantMessage(
        content=text, tool_calls=[ToolCall(id=cid, name="bash", arguments=json.dumps({"command": command}))]
    )


def out(cid: str, text: str) -> ToolMessage:
    return ToolMessage(tool_call_id=cid, name="bash", content=text)


@pytest.fixture(scope="module")
def model() -> ExtractiveModel:
    return ExtractiveModel(TiktokenCounter())


def summary(
    model: ExtractiveModel, source: list[AnyMessage], target: int, recent: Sequence[AnyMessage] = ()
) -> str:
    contract = OutputContract(
        kind="blocks",
        blocks=[ContractBlock(block_id="b1", target_tokens=target, source=source)],
        sections=list(BLOCK_SECTIONS),
        recent=list(recent),
    )
    text = model.complete([UserMessage(content="x")], max_tokens=target * 2, contract=contract).text
    return str(json.loads(text)["blocks"][0]["summary"])


def lines_of(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith("- ")]


def test_a_command_is_kept_whole_and_a_heredoc_body_left_out() -> None:
    assert command_text({"command": SED}) == SED
    heredoc = "cat <<'EOF' > check.py\nimport os\nprint(os.sep)\nEOF\npython3 check.py"
    assert command_text({"command": heredoc}) == "cat <<'EOF' > check.py\npython3 check.py"
    assert command_text({"path": "a.py"}) is None
    long = "echo " + "word " * COMMAND_CHARS
    shortened = command_text({"command": long})
    assert shortened is not None and len(shortened) <= COMMAND_CHARS and shortened.endswith("…")


def test_an_edit_command_is_never_cut_after_its_first_line_number(model: ExtractiveModel) -> None:
    source: list[AnyMessage] = [
        UserMessage(content="Rename the fields."),
        bash("c1", SED, "THOUGHT: apply the five edits."),
        out("c1", "<returncode>0</returncode>\n<output>\n</output>"),
    ]
    text = summary(model, source, 300)
    assert any(SED in line for line in lines_of(text)), text


def test_a_short_output_is_shown_whole_its_values_side_by_side() -> None:
    lines = [("<returncode>0</returncode>", False), ("expected 9/40", False), ("got 0.225", False)]
    assert result_line(lines) == "<returncode>0</returncode> | expected 9/40 | got 0.225"
    many = [(f"line number {i} of a long listing with words", False) for i in range(10)]
    assert result_line(many) == many[0][0]


def test_code_lines_of_a_viewed_file_keep_their_line_numbers(model: ExtractiveModel) -> None:
    viewed = "\n".join(
        [
            "   524\t    def _recurse(self, direntry):",
            "   525\t        ihook = self.gethookproxy(direntry.path)",
            '   526\t        norecursepatterns = self.config.getini("norecursedirs")',
        ]
    )
    source: list[AnyMessage] = [
        UserMessage(content="Fix the norecurse check."),
        bash("c1", "nl -ba src/_pytest/main.py | sed -n '520,530p'"),
        out("c1", viewed),
    ]
    text = summary(model, source, 400)
    assert '526 norecursepatterns = self.config.getini("norecursedirs")' in text, text


def test_the_agents_list_of_bare_names_stays_with_its_sentence(model: ExtractiveModel) -> None:
    plan = "THOUGHT: These distributions need a `_cdf` method:\n1. Arcsin\n2. Dagum\n3. Erlang\n\nI'll start with Arcsin."
    source: list[AnyMessage] = [
        UserMessage(content="Add _cdf methods."),
        bash("c1", "ls", plan),
        out("c1", "a.py"),
    ]
    text = summary(model, source, 400)
    assert "These distributions need a `_cdf` method: Arcsin; Dagum; Erlang" in text, text
    assert not any(line.endswith((": Arcsin", ": Dagum", ": Erlang")) for line in lines_of(text))


def test_a_numbered_plan_item_is_a_line_of_its_own(model: ExtractiveModel) -> None:
    plan = "THOUGHT: Done so far:\n1. `lib/backend_agg.py`: updated `draw_text` and `draw_mathtext`.\n2. `lib/text.py`: set the flag."
    source: list[AnyMessage] = [
        UserMessage(content="Fix antialiasing."),
        bash("c1", "git diff", plan),
        out("c1", ""),
    ]
    text = summary(model, source, 400)
    assert "- assistant: 1. `lib/backend_agg.py`: updated `draw_text` and `draw_mathtext`." in text, text


def test_an_error_carries_the_frame_where_it_happened(model: ExtractiveModel) -> None:
    trace = "\n".join(
        [
            "Traceback (most recent call last):",
            '  File "/testbed/repro.py", line 5, in <module>',
            "    requests.get(url)",
            '  File "/testbed/requests/models.py", line 401, in prepare_url',
            "    raise InvalidURL('URL has an invalid label.')",
            "ValueError: URL has an invalid label.",
        ]
    )
    source: list[AnyMessage] = [
        UserMessage(content="Fix the URL error."),
        bash("c1", "python repro.py"),
        out("c1", trace),
    ]
    text = summary(model, source, 300)
    assert (
        'ValueError: URL has an invalid label. [File "/testbed/requests/models.py", '
        "line 401, in prepare_url]" in text
    ), text


def test_lines_about_the_working_set_win_a_tight_budget(model: ExtractiveModel) -> None:
    source: list[AnyMessage] = [UserMessage(content="Fix the bug.")]
    for i, name in enumerate(["alpha_module.py", "beta_module.py", "gamma_module.py", "delta_module.py"]):
        source += [
            bash(f"c{i}", f"nl -ba pkg/{name} | sed -n '10,12p'"),
            out(f"c{i}", f"    1{i}\t    value_{i} = compute_{i}(data)  # in {name}"),
        ]
    recent: list[AnyMessage] = [bash("c9", "sed -i '12s/compute_2/compute_two/' pkg/gamma_module.py")]
    without = summary(model, source, 90)
    with_recent = summary(model, source, 90, recent)
    assert "value_2 = compute_2(data)" in with_recent, with_recent
    assert with_recent != without
