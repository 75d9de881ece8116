"""The working set and verify-before-commit: what the agent still works on stays in a block."""

from __future__ import annotations

import json

from ctxcore.messages import AnyMessage, AssistantMessage, ToolCall, ToolMessage, UserMessage
from ctxcore.pipeline.verify import verify_block
from ctxcore.summarize.working_set import mentions, source_lines, working_set
from ctxcore.tokens import TiktokenCounter


def bash(cid: str, command: str, text: str = "") -> AssistantMessage:
    return AssistantMessage(
        content=text, tool_calls=[ToolCall(id=cid, name="bash", arguments=json.dumps({"command": command}))]
    )


def out(cid: str, text: str) -> ToolMessage:
    return ToolMessage(tool_call_id=cid, name="bash", content=text)


STEPS: list[AnyMessage] = [
    UserMessage(content="Fix the norecurse check."),
    bash("c1", "nl -ba src/pytest/main.py | sed -n '520,530p'"),
    out(
        "c1",
        '   526\t        norecursepatterns = self.config.getini("norecursedirs")\n'
        "   527\t        if any(path.check(fnmatch=pat) for pat in norecursepatterns):\n"
        "   528\t            return False",
    ),
    bash("c2", "ls docs", "THOUGHT: the docs may say something."),
    out("c2", "index.rst\nchangelog.rst"),
]
RECENT: list[AnyMessage] = [
    bash(
        "c3", "sed -i '526s/getini/getini_list/' src/pytest/main.py", "THOUGHT: change `self.config.getini`."
    ),
    out("c3", ""),
]
SUMMARY = (
    "## Task state\n- user: Fix the norecurse check.\n## Files and changes\n(none)\n## Next steps\n(none)"
)


def test_working_set_names_the_files_and_symbols_the_newest_calls_act_on() -> None:
    found = working_set(RECENT)
    assert {"src/pytest/main.py", "main.py"} <= found.files
    assert "self.config.getini" in found.symbols
    # A tool's listing names no symbols: everything in it would count as current.
    assert working_set([out("c9", "some_function other_name")]).symbols == frozenset()


def test_working_set_reads_a_command_given_as_an_argument_vector() -> None:
    # Codex CLI calls its shell with ``["bash", "-lc", "<script>"]``.
    call = ToolCall(
        id="c1",
        name="shell",
        arguments=json.dumps(
            {"command": ["bash", "-lc", "sed -i '526s/a/b/' src/pytest/main.py"], "workdir": "/r"}
        ),
    )
    found = working_set([AssistantMessage(content="", tool_calls=[call])])
    assert {"src/pytest/main.py", "main.py"} <= found.files


def test_mentions_matches_whole_names_only() -> None:
    assert mentions("a = self.config.getini('x')", frozenset(["self.config.getini"]))
    assert not mentions("a = self.config.getini_list('x')", frozenset(["self.config.getini"]))


def test_a_block_missing_working_set_lines_gets_them_back_from_the_replaced_steps() -> None:
    counter = TiktokenCounter()
    verdict = verify_block(SUMMARY, STEPS, RECENT, 500, counter)
    assert verdict.text is not None and verdict.restored >= 1
    # Restored verbatim, tagged with its source, under the files heading (no "(none)" left there).
    assert '- tool bash: 526 norecursepatterns = self.config.getini("norecursedirs")' in verdict.text
    files = verdict.text.split("## Files and changes")[1].split("## Next steps")[0]
    assert "(none)" not in files
    assert verdict.text.endswith("## Next steps\n(none)")


def test_a_block_that_already_names_the_working_set_is_saved_as_it_is() -> None:
    counter = TiktokenCounter()
    text = SUMMARY.replace("(none)", "- tool bash: 526 self.config.getini in src/pytest/main.py", 1)
    verdict = verify_block(text, STEPS, RECENT, 500, counter)
    assert verdict.text == text and verdict.restored == 0 and verdict.names >= 2


def test_no_room_for_the_lines_keeps_the_steps_raw() -> None:
    counter = TiktokenCounter()
    verdict = verify_block(SUMMARY, STEPS, RECENT, counter.count_text(SUMMARY) + 2, counter)
    assert verdict.text is None and verdict.restored == 0


def test_a_working_set_the_replaced_steps_never_touched_changes_nothing() -> None:
    counter = TiktokenCounter()
    elsewhere = [bash("c4", "cat src/other/thing.py", "THOUGHT: look at `other_helper`.")]
    verdict = verify_block(SUMMARY, STEPS, elsewhere, 500, counter)
    assert verdict == verify_block(SUMMARY, STEPS, [], 500, counter)
    assert verdict.text == SUMMARY and verdict.names == 0


def test_minified_or_binary_output_is_never_restored() -> None:
    counter = TiktokenCounter()
    blob = "self.config.getini(" + "x" * 50_000 + ")"
    steps: list[AnyMessage] = [bash("c1", "cat build/min.js"), out("c1", blob)]
    assert source_lines(steps, frozenset(["self.config.getini"])) == []
    verdict = verify_block(SUMMARY, steps, RECENT, 500, counter)
    assert verdict.text == SUMMARY


def test_restored_lines_take_the_place_of_the_oldest_lines_about_something_else() -> None:
    counter = TiktokenCounter()
    old = "\n".join(f"- assistant: looked at the unrelated helper number {k} in docs" for k in range(6))
    text = f"## Task state\n- user: Fix the norecurse check.\n{old}\n## Files and changes\n(none)"
    verdict = verify_block(text, STEPS, RECENT, counter.count_text(text), counter)
    assert verdict.text is not None and verdict.restored >= 1
    assert counter.count_text(verdict.text) <= counter.count_text(text)
    assert "self.config.getini" in verdict.text and "- user: Fix the norecurse check." in verdict.text
    # The oldest unrelated lines went first; the newest stayed.
    assert "helper number 0 " not in verdict.text and "helper number 5 " in verdict.text


def test_one_definition_of_a_bare_line_for_the_list_joining_and_the_check() -> None:
    from ctxcore.pipeline import verify
    from ctxcore.summarize import bare
    from ctxcore.summarize.extractive import lists

    assert verify.bare_line is bare.bare_line and lists.bare_line is bare.bare_line
    bare_ones = (
        "src/a.py",
        "  526",
        "1. Arcsin",
        "os.path.join",
        "foo_bar, BazQux",
        "```bash",
        "```",
        "`axis.py`:",
        "@classmethod",
        "'django.contrib.contenttypes',",
        "918 'widget', 'label', 'help_text',",
        '`printf "114a\\n..."`',
        "THOUGHT:",
    )
    for line in bare_ones:
        assert bare.bare_line(line), line
    for line in (
        "fix the lookup in src/a.py",
        "    return compute(x)",
        "2. check the `save` path",
        "method=request.method.upper(),",
        'THOUGHT: "found 6 actions".',
    ):
        assert not bare.bare_line(line), line


def test_an_earlier_blocks_lines_are_restored_with_their_own_tag_and_never_its_header() -> None:
    counter = TiktokenCounter()
    block = UserMessage(
        content="[ROUND_LEVEL_MEMORY_BLOCK]\ntype: historical_memory_block\n## Files and changes\n"
        '- tool bash: 526 norecursepatterns = self.config.getini("norecursedirs")\n'
    )
    recent: list[AnyMessage] = [
        bash(
            "c3", "grep -n historical_memory_block src/pytest/main.py", "THOUGHT: `self.config.getini` again."
        )
    ]
    verdict = verify_block(SUMMARY, [block], recent, 500, counter)
    assert verdict.text is not None and verdict.restored == 1, verdict
    assert '- tool bash: 526 norecursepatterns = self.config.getini("norecursedirs")' in verdict.text
    assert "- user: - tool" not in verdict.text and "historical_memory_block" not in verdict.text
