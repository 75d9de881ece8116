"""``bench/harness_forms.py`` rewrites a bash-only run into other harnesses' tool forms,
keeping every text and result it does not rewrite."""

from __future__ import annotations

import json

from bench.harness_forms import rewrite


def _run(*commands: str) -> dict[str, object]:
    messages: list[dict[str, object]] = [{"role": "user", "content": "Fix it."}]
    for n, command in enumerate(commands):
        messages.append(
            {
                "role": "assistant",
                "content": "THOUGHT: next.",
                "tool_calls": [
                    {"id": f"c{n}", "name": "bash", "arguments": json.dumps({"command": command})}
                ],
            }
        )
        messages.append(
            {"role": "tool", "tool_call_id": f"c{n}", "name": "bash", "content": "<returncode>0</returncode>"}
        )
    return {"id": "r1", "source": "mini", "messages": messages}


def _calls(run: dict[str, object]) -> list[tuple[str, dict[str, object]]]:
    out = []
    for message in run["messages"]:  # type: ignore[attr-defined]
        for call in message.get("tool_calls") or []:
            out.append((call["name"], json.loads(call["arguments"])))
    return out


def test_a_lone_heredoc_write_becomes_an_editor_create_and_the_rest_execute_bash() -> None:
    write = "cat <<'EOF' > check.py\nimport os\nprint(os.sep)\nEOF"
    script = "cat <<'EOF' > a.py\nx = 1\nEOF\npython3 a.py"
    out = rewrite(_run(write, script, "ls -la"))
    assert _calls(out) == [
        (
            "str_replace_editor",
            {"command": "create", "path": "check.py", "file_text": "import os\nprint(os.sep)\n"},
        ),
        ("execute_bash", {"command": script, "is_input": "false"}),
        ("execute_bash", {"command": "ls -la", "is_input": "false"}),
    ]
    results = [m for m in out["messages"] if m["role"] == "tool"]  # type: ignore[index]
    assert results[0] == {
        "role": "tool",
        "tool_call_id": "c0",
        "name": "str_replace_editor",
        "content": "File created successfully at: check.py",
    }
    assert [r["name"] for r in results[1:]] == ["execute_bash", "execute_bash"]
    assert [m["content"] for m in out["messages"] if m["role"] != "tool"] == [  # type: ignore[index]
        "Fix it.",
        "THOUGHT: next.",
        "THOUGHT: next.",
        "THOUGHT: next.",
    ]


def test_a_numbered_view_that_printed_becomes_an_editor_view() -> None:
    run = _run("nl -ba src/app.py | sed -n '519,521p'", "nl -ba src/gone.py | sed -n '1,2p'")
    messages = run["messages"]
    messages[2]["content"] = (
        "<returncode>0</returncode>\n<output>\n   519\tdef f():\n   520\t    return 1\n</output>"  # type: ignore[index]
    )
    messages[4]["content"] = "<returncode>1</returncode>\n<output>\nnl: src/gone.py: No such file\n</output>"  # type: ignore[index]
    out = rewrite(run)
    assert _calls(out) == [
        ("str_replace_editor", {"command": "view", "path": "src/app.py", "view_range": [519, 521]}),
        ("execute_bash", {"command": "nl -ba src/gone.py | sed -n '1,2p'", "is_input": "false"}),
    ]
    results = [m for m in out["messages"] if m["role"] == "tool"]  # type: ignore[index]
    assert (
        results[0]["content"]
        == "Here's the result of running `cat -n` on src/app.py:\n   519\tdef f():\n   520\t    return 1\n"
    )
    assert results[1]["content"] == messages[4]["content"]  # type: ignore[index]


def test_the_codex_form_calls_shell_with_an_argument_vector() -> None:
    out = rewrite(_run("ls -la"), "codex")
    assert _calls(out) == [("shell", {"command": ["bash", "-lc", "ls -la"], "workdir": "/testbed"})]
    assert [m["name"] for m in out["messages"] if m["role"] == "tool"] == ["shell"]  # type: ignore[index]


def test_the_claude_form_writes_reads_and_runs_as_claude_code_does() -> None:
    write = "cat <<'EOF' > check.py\nprint(1)\nEOF"
    run = _run(write, "nl -ba src/app.py | sed -n '519,520p'", "ls")
    run["messages"][4]["content"] = (
        "<returncode>0</returncode>\n<output>\n   519\tdef f():\n   520\t    return 1\n</output>"  # type: ignore[index]
    )
    out = rewrite(run, "claude")
    assert _calls(out) == [
        ("Write", {"file_path": "check.py", "content": "print(1)\n"}),
        ("Read", {"file_path": "src/app.py", "offset": 519, "limit": 2}),
        ("Bash", {"command": "ls", "description": "Run the command"}),
    ]
    results = [m for m in out["messages"] if m["role"] == "tool"]  # type: ignore[index]
    assert [r["name"] for r in results] == ["Write", "Read", "Bash"]
    assert results[1]["content"] == "   519→def f():\n   520→    return 1\n"
