"""Rewrite mini-swe-agent runs into the tool forms of other agent harnesses.

The development runs call one tool, ``bash``, with one argument (``{"command": ...}``).
Other harnesses call a shell tool with more than one argument, or with an argument vector,
and write and read files through an editor tool. This rewrites each run into one of those
forms so the summaries can be measured on them (``bench/retention.py --harness-form``):

* ``openhands``: a call whose command is one heredoc write (``cat <<'EOF' > path`` ...
  ``EOF``, nothing else) becomes ``str_replace_editor`` ``create`` of that file with the
  heredoc's body, answered as the editor answers; a numbered view (``nl -ba path | sed -n
  'a,bp'``, whose output is ``cat -n``'s format) that printed its lines becomes an editor
  ``view`` with ``view_range`` [a, b], answered with the editor's caption and the same lines;
  every other call becomes ``execute_bash`` with ``is_input="false"``.
* ``codex``: every call becomes ``shell`` with the argument vector ``["bash", "-lc",
  <command>]`` and a ``workdir``, as Codex CLI calls its shell.
* ``claude``: as Claude Code calls its tools: a lone heredoc write becomes ``Write`` with
  ``file_path`` and ``content``; a numbered view that printed becomes ``Read`` with
  ``file_path``, ``offset`` and ``limit``, answered with the same lines numbered ``N→``;
  every other call becomes ``Bash`` with ``command`` and a ``description``.

Texts, other results and everything else are kept. The words the rewrite adds (``create``,
``view``, ``false``, ``bash``, ``-lc``, ``/testbed``, the description) are no reference the
eval counts; the editor's answers name the path the command named, and a view's range holds
the numbers its command held (a ``Read``'s ``limit`` is its line count).

Two more rewrites keep the calls as they are: ``as_content_parts`` sends every text as a list
of text parts (``retention.py --content-parts``), ``with_huge_outputs`` grows every 8th tool
result past any window (``retention.py --huge-outputs``, ``bench/newest_output.py``).

    .venv/bin/python bench/harness_forms.py openhands ../shared/data/minisweagent_dev.jsonl /tmp/oh.jsonl
    ctxcore eval /tmp/oh.jsonl --ids <half> --policy steps,full --budget 16000
"""

from __future__ import annotations

import argparse
import json
import re
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

Form = Literal["openhands", "codex", "claude"]
FORMS: tuple[Form, ...] = ("openhands", "codex", "claude")

# ``cat <<'EOF' > path`` (or ``cat > path <<'EOF'``), its body, the delimiter: the whole command.
_HEREDOC_WRITE = re.compile(
    r"\A\s*cat\s+(?:<<-?\s*(['\"]?)(?P<d1>\w+)\1\s*>\s*(?P<p1>[\w./@-]+)"
    r"|>\s*(?P<p2>[\w./@-]+)\s*<<-?\s*(['\"]?)(?P<d2>\w+)\5)\s*\n(?P<body>.*)\n(?P=d1)?(?P=d2)?\s*\Z",
    re.S,
)


def _editor_create(command: str) -> dict[str, Any] | None:
    match = _HEREDOC_WRITE.match(command)
    if match is None:
        return None
    delimiter = match.group("d1") or match.group("d2")
    body = match.group("body")
    if any(line.strip() == delimiter for line in body.splitlines()):
        return None  # more than one heredoc: a script, not one file write
    return {"command": "create", "path": match.group("p1") or match.group("p2"), "file_text": body + "\n"}


# ``nl -ba path | sed -n 'a,bp'``: a numbered view of lines a..b, printed as ``cat -n`` prints.
_NUMBERED_VIEW = re.compile(r"\A\s*nl -ba (?P<path>[\w./@-]+) \| sed -n '(?P<a>\d+),(?P<b>\d+)p'\s*\Z")
# A mini-swe-agent result: the return code, then the output.
_RESULT = re.compile(r"\A<returncode>0</returncode>\n<output>\n(?P<out>.*)</output>\s*\Z", re.S)


def _editor_view(command: str) -> dict[str, Any] | None:
    match = _NUMBERED_VIEW.match(command)
    if match is None:
        return None
    return {
        "command": "view",
        "path": match.group("path"),
        "view_range": [int(match.group("a")), int(match.group("b"))],
    }


def rewrite(run: dict[str, Any], form: Form = "openhands") -> dict[str, Any]:
    """``run`` (one JSONL record) with its calls in ``form``'s tool forms."""
    if form == "codex":
        return _rewrite(
            run,
            lambda _id, command: ("shell", {"command": ["bash", "-lc", command], "workdir": "/testbed"}),
            lambda _id, content: ("shell", content),
            form,
        )
    if form == "claude":
        return _claude(run)
    # A view is rewritten only when its result is a whole output (no error, no warning).
    results_ok = _whole_outputs(run)
    created: dict[str, str] = {}  # tool_call_id -> path written by an editor create
    viewed: dict[str, str] = {}  # tool_call_id -> path an editor view shows

    def call_form(call_id: str, command: str) -> tuple[str, dict[str, Any]]:
        editor = _editor_create(command)
        if editor is not None:
            created[call_id] = editor["path"]
            return "str_replace_editor", editor
        view = _editor_view(command)
        if view is not None and call_id in results_ok:
            viewed[call_id] = view["path"]
            return "str_replace_editor", view
        return "execute_bash", {"command": command, "is_input": "false"}

    def result_form(call_id: str, content: str) -> tuple[str, str]:
        if call_id in created:
            return "str_replace_editor", f"File created successfully at: {created[call_id]}"
        if call_id in viewed:
            caption = f"Here's the result of running `cat -n` on {viewed[call_id]}:"
            return "str_replace_editor", f"{caption}\n{results_ok[call_id]}"
        return "execute_bash", content

    return _rewrite(run, call_form, result_form, form)


def _whole_outputs(run: dict[str, Any]) -> dict[str, str]:
    """Each call's output when its result is a whole one (return code 0, no warning)."""
    out: dict[str, str] = {}
    for message in run["messages"]:
        found = _RESULT.match(message.get("content") or "") if message.get("role") == "tool" else None
        if found is not None:
            out[message.get("tool_call_id", "")] = found.group("out")
    return out


def _claude(run: dict[str, Any]) -> dict[str, Any]:
    results_ok = _whole_outputs(run)
    answers: dict[str, tuple[str, str]] = {}  # tool_call_id -> (tool, result)

    def call_form(call_id: str, command: str) -> tuple[str, dict[str, Any]]:
        editor = _editor_create(command)
        if editor is not None:
            answers[call_id] = ("Write", f"File created successfully at: {editor['path']}")
            return "Write", {"file_path": editor["path"], "content": editor["file_text"]}
        view = _editor_view(command)
        if view is not None and call_id in results_ok:
            first, last = view["view_range"]
            lines = re.sub(r"(?m)^(\s*\d+)\t", "\\1→", results_ok[call_id])
            answers[call_id] = ("Read", lines)
            return "Read", {"file_path": view["path"], "offset": first, "limit": last - first + 1}
        return "Bash", {"command": command, "description": "Run the command"}

    def result_form(call_id: str, content: str) -> tuple[str, str]:
        return answers.get(call_id, ("Bash", content))

    return _rewrite(run, call_form, result_form, "claude")


def _rewrite(
    run: dict[str, Any],
    call_form: Callable[[str, str], tuple[str, dict[str, Any]]],
    result_form: Callable[[str, str], tuple[str, str]],
    form: Form,
) -> dict[str, Any]:
    """``run`` with each ``bash`` call renamed and re-argued by ``call_form`` (its id, its
    command) and its result by ``result_form`` (its call's id, its content), in order."""
    rewritten: set[str] = set()
    messages: list[dict[str, Any]] = []
    for message in run["messages"]:
        message = dict(message)
        if message.get("role") == "assistant" and message.get("tool_calls"):
            calls = []
            for call in message["tool_calls"]:
                call = json.loads(json.dumps(call))
                fn = call.get("function", call)  # OpenAI's nested form or the flat one
                args = json.loads(fn["arguments"]) if fn["arguments"].strip() else {}
                command = args.get("command") if isinstance(args, dict) else None
                if fn["name"] == "bash" and isinstance(command, str):
                    fn["name"], new_args = call_form(call["id"], command)
                    fn["arguments"] = json.dumps(new_args)
                    rewritten.add(call["id"])
                calls.append(call)
            message["tool_calls"] = calls
        elif message.get("role") == "tool" and message.get("tool_call_id") in rewritten:
            message["name"], message["content"] = result_form(
                message["tool_call_id"], message.get("content") or ""
            )
        messages.append(message)
    return {**run, "messages": messages, "source": f"{run.get('source', '')}+{form}-form"}


def as_content_parts(run: dict[str, Any]) -> dict[str, Any]:
    """``run`` with every non-empty text content sent as a list of one text part, as
    harnesses that cache prompts send it (OpenHands with function calling, LiteLLM's
    Anthropic route), the system prompt's part marked ``cache_control`` as they mark it."""
    messages = []
    for message in run["messages"]:
        content = message.get("content")
        if isinstance(content, str) and content:
            part: dict[str, Any] = {"type": "text", "text": content}
            if message.get("role") == "system":
                part["cache_control"] = {"type": "ephemeral"}
            message = {**message, "content": [part]}
        messages.append(message)
    return {**run, "messages": messages, "source": f"{run.get('source', '')}+parts"}


# A line of a verbose test log naming nothing the runs name (no path, identifier or number of
# theirs), so that no reference the eval counts in a run's next steps can be found in it.
FILLER_LINE = "tests/generated/test_filler.py::test_case PASSED\n"


def with_huge_outputs(run: dict[str, Any], chars: int, every: int = 8) -> dict[str, Any]:
    """``run`` with every ``every``-th tool result (the ``every``-th, the ``2 * every``-th, ...)
    preceded by filler log lines up to ``chars`` characters: an output no harness truncated
    (a verbose test run whose verdict is at its end), larger than the window."""
    messages = []
    seen = 0
    for message in run["messages"]:
        if message.get("role") == "tool" and isinstance(message.get("content"), str):
            seen += 1
            if seen % every == 0:
                filler = FILLER_LINE * max(chars // len(FILLER_LINE), 1)
                message = {**message, "content": filler + message["content"]}
        messages.append(message)
    return {**run, "messages": messages, "source": f"{run.get('source', '')}+huge-outputs"}


FOLLOW_UP = (
    "Thanks. Before you finish, also make sure the existing tests still pass and keep the change minimal."
)


def with_follow_up(run: dict[str, Any], at: float = 0.6) -> dict[str, Any]:
    """``run`` with the user speaking again at ``at`` of its messages, between two steps (before
    the first assistant message from there that follows a tool result): a coding session of
    two requests, the second one long, as a user who follows up makes it."""
    messages = list(run["messages"])
    for i in range(max(int(len(messages) * at), 1), len(messages)):
        if messages[i].get("role") == "assistant" and messages[i - 1].get("role") == "tool":
            messages.insert(i, {"role": "user", "content": FOLLOW_UP})
            break
    return {**run, "messages": messages, "source": f"{run.get('source', '')}+follow-up"}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("form", choices=FORMS)
    parser.add_argument("source", type=Path)
    parser.add_argument("out", type=Path)
    args = parser.parse_args()
    rows = [json.loads(line) for line in args.source.read_text().splitlines() if line.strip()]
    out = [rewrite(row, args.form) for row in rows]
    args.out.write_text("".join(json.dumps(row) + "\n" for row in out))
    names = Counter(
        c.get("function", c)["name"]
        for row in out
        for m in row["messages"]
        for c in m.get("tool_calls") or []
    )
    print(f"{len(out)} runs -> {args.out}; calls: {dict(names.most_common())}")


if __name__ == "__main__":
    main()
