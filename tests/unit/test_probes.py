"""Probes of a raw agent run (``ctxcore.eval.probes``) and the shell reading behind them."""

from __future__ import annotations

import json
from typing import Any

from ctxcore.eval.probes import ProbeTracker, WindowText, find_probes, score_probes
from ctxcore.eval.shell import file_effects, repo_relative
from ctxcore.messages import AnyMessage, AssistantMessage, ToolCall, ToolMessage, UserMessage

TRACE = (
    "Traceback (most recent call last):\n"
    '  File "/testbed/app/core.py", line 3, in <module>\n'
    "    load(text)\n"
    '  File "/testbed/app/core.py", line 9, in load\n'
    "    raise ValueError('empty config')\n"
    "ValueError: empty config\n"
)


def bash(cid: str, command: str) -> AssistantMessage:
    return AssistantMessage(
        content="run it",
        tool_calls=[ToolCall(id=cid, name="bash", arguments=json.dumps({"command": command}))],
    )


def editor(cid: str, **args: Any) -> AssistantMessage:
    return AssistantMessage(
        content="", tool_calls=[ToolCall(id=cid, name="str_replace_editor", arguments=json.dumps(args))]
    )


def out(cid: str, text: str) -> ToolMessage:
    return ToolMessage(tool_call_id=cid, content=text)


def run() -> list[AnyMessage]:
    return [
        UserMessage(content="Fix the crash when the config is empty."),
        editor("v", command="view", path="/workspace/app/app/core.py"),
        out("v", "def load(text): ..."),
        bash("c", "cat app/config.py && nl -ba ./app/util.py | sed -n '1,20p' ./app/extra.py"),
        out("c", "DEFAULT = {}"),
        bash("t", "python -m pytest tests/test_core.py"),
        out("t", "collected 3 items\n\n" + TRACE + "FAILED tests/test_core.py::test_empty - ValueError\n"),
        editor("e", command="str_replace", path="/testbed/app/core.py", old_str="a", new_str="b"),
        out("e", "edited"),
        bash("w", "cat > /testbed/notes.txt <<'EOF'\nif a > b: pass\nEOF\nsed -i 's/x/y/' app/config.py"),
        out("w", "   \n\t"),
        bash("r", "python repro.py"),
        out("r", TRACE.replace("empty config", "still empty")),
    ]


def test_probes_of_a_run() -> None:
    probes = find_probes(run())
    assert probes.edited_files == {"app/core.py", "notes.txt", "app/config.py"}
    # Viewed: editor views and printed .py files, minus what was edited later.
    assert probes.viewed_files == {"app/util.py", "app/extra.py"}
    assert probes.first_exception == "ValueError: empty config"
    assert probes.last_exception == "ValueError: still empty"
    assert probes.last_failing_test == "tests/test_core.py::test_empty"
    # The whitespace-only output is never the newest head.
    assert probes.newest_head is not None and probes.newest_head.startswith(
        "Traceback (most recent call last):"
    )
    assert probes.last_commands == {
        "app/core.py",
        "cat > /testbed/notes.txt <<'EOF' if a > b: pass EOF sed -i 's/x/y/' app/config.py",
        "python repro.py",
    }
    assert probes.malformed_calls == 0


def test_the_later_of_a_traceback_and_a_failed_line_is_the_last_exception() -> None:
    messages = run()[:7]
    assert find_probes(messages).last_exception == "FAILED tests/test_core.py::test_empty - ValueError"
    later = [
        *messages,
        bash("u", "python -m unittest"),
        out("u", "FAIL: test_load (tests.test_core.LoadTest)\n"),
    ]
    probes = find_probes(later)
    assert probes.last_failing_test == "test_load (tests.test_core.LoadTest)"
    assert probes.last_exception == "FAILED tests/test_core.py::test_empty - ValueError"
    # A log line that says ERROR names no test.
    assert find_probes([*later, bash("l", "x"), out("l", "ERROR root: lost")]).last_failing_test == (
        "test_load (tests.test_core.LoadTest)"
    )


def test_the_tracker_gives_the_probes_of_each_prefix() -> None:
    messages = run()
    tracker = ProbeTracker()
    for n, message in enumerate(messages, 1):
        tracker.add(message)
        assert tracker.snapshot() == find_probes(messages[:n])
    assert find_probes(messages[:1]).present() == {}


def test_presence_is_whitespace_normalised_and_set_probes_score_shares() -> None:
    messages = run()
    probes = find_probes(messages)
    assert all(score == 1.0 for score in score_probes(WindowText(messages), probes).values())
    squeezed = [
        UserMessage(content="ValueError:   still\nempty  | app/util.py"),
        editor("x", command="view", path="app/core.py"),
    ]
    scores = score_probes(WindowText(squeezed), probes)
    assert scores["last_exception"] == 1.0 and scores["first_exception"] == 0.0
    assert scores["viewed_files"] == 0.5
    assert scores["edited_files"] == 1 / 3  # the call's decoded argument counts as window text
    # A failed window scores 0 on every probe the run has.
    assert set(score_probes(None, probes).values()) == {0.0}


def test_malformed_arguments_feed_no_probe_but_stay_window_text() -> None:
    bad = AssistantMessage(
        content="", tool_calls=[ToolCall(id="m", name="bash", arguments="{not json sed -i f.py")]
    )
    probes = find_probes([UserMessage(content="task"), bad, out("m", "ok")])
    assert (
        probes.malformed_calls == 1
        and probes.edited_files == frozenset()
        and probes.last_commands == frozenset()
    )
    assert WindowText([bad]).has("{not json sed -i f.py")


def test_a_multi_megabyte_output_is_read_once() -> None:
    big = "noise line\n" * 400_000 + TRACE
    probes = find_probes([UserMessage(content="task"), bash("b", "make"), out("b", big)])
    assert probes.last_exception == "ValueError: empty config"
    assert probes.newest_head is not None and len(probes.newest_head) == 300


def test_shell_effects() -> None:
    effects = file_effects('grep ">" file.py > out.txt 2>&1 && sed -i.bak -e "s/a/b/" ./x.py y.py')
    assert effects.written == ["out.txt", "x.py", "y.py"] and effects.viewed == []
    assert file_effects("python - <<EOF\nopen('/testbed/z.py', 'a').write('')\nEOF").written == ["z.py"]
    assert file_effects("head -n 5 a.py b.txt 2>/dev/null; tail c.py").viewed == ["a.py", "c.py"]
    assert file_effects("echo 'unbalanced > x.py").written == []  # no crash on a bad quote
    assert repo_relative("/workspace/django/django/db/models.py") == "django/db/models.py"
    assert repo_relative("./a/b.py") == "a/b.py"
