"""The extractive summariser keeps content in the line it came from: shell commands whole,
and the agent's own lists with the sentence that says what they list (no bare-name lines)."""

from __future__ import annotations

import json

import pytest

from ctxcore.messages import AnyMessage, AssistantMessage, ToolCall, ToolMessage, UserMessage
from ctxcore.summarize import ContractBlock, ExtractiveModel, OutputContract
from ctxcore.summarize.bare import bare_line
from ctxcore.summarize.extractive.lists import with_bare_joined
from ctxcore.summarize.extractive.rules import without
from ctxcore.summarize.extractive.tools import COMMAND_CHARS, command_text, json_fields
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


def summary(model: ExtractiveModel, source: list[AnyMessage], target: int) -> str:
    contract = OutputContract(
        kind="blocks",
        blocks=[ContractBlock(block_id="b1", target_tokens=target, source=source)],
        sections=list(BLOCK_SECTIONS),
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


def test_a_directory_listing_line_is_no_fact(model: ExtractiveModel) -> None:
    listing = "\n".join(
        [
            "total 160",
            "drwxrwxrwx 8 root root 4096 Oct 24 2024 .git",
            "-rw-r--r-- 1 root root 610 Oct 24 2024 .coveragerc",
            "-rw-r--r-- 1 root root 19454 Oct 24 2024 CONTRIBUTING.rst",
        ]
    )
    source: list[AnyMessage] = [UserMessage(content="Fix it."), bash("c1", "ls -la", ""), out("c1", listing)]
    text = summary(model, source, 400)
    # Only the call's own one-line result names the listing; its dated lines are no facts.
    assert "CONTRIBUTING.rst" not in text and ".coveragerc" not in text, text


def test_a_bare_line_is_kept_only_inside_the_line_it_belongs_to(model: ExtractiveModel) -> None:
    thought = "THOUGHT: The failing offsets are at these lines of base.py\n1261\n1722\n`get_foreign_related_value`\nNext I fix them."
    source: list[AnyMessage] = [
        UserMessage(content="Fix the offsets."),
        bash("c1", "grep -n offset django/db/models/base.py", thought),
        out("c1", "1261: offset = 0"),
    ]
    text = summary(model, source, 400)
    assert "these lines of base.py; 1261; 1722; `get_foreign_related_value`" in text, text
    assert not any(bare_line(line.split(": ", 1)[-1]) for line in lines_of(text)), text
    assert with_bare_joined("1261\n1722") == ""


def test_a_label_or_a_decorator_joins_the_line_after_it_and_a_fence_goes() -> None:
    text = "the code to change:\n`axis.py`:\n```python\n@classmethod\ndef convert(cls, x):\n```\nthen run it."
    assert (
        with_bare_joined(text)
        == "the code to change:\n`axis.py`: @classmethod def convert(cls, x):\nthen run it."
    )
    assert with_bare_joined("```bash\ngrep -n offset base.py\n```") == "grep -n offset base.py"


def test_a_harness_reminder_keeps_no_fence_or_bare_line(model: ExtractiveModel) -> None:
    reminder = (
        "Please format your action in triple backticks as shown in <response_example>.\n\n"
        "<response_example>\nHere are some thoughts about why you want to perform the action.\n\n"
        "```bash\n<action>\n```\n</response_example>"
    )
    source: list[AnyMessage] = [
        UserMessage(content="Fix the offsets."),
        bash("c1", "grep -n offset django/db/models/base.py", "THOUGHT: look for the offsets."),
        out("c1", "1261: offset = 0"),
        UserMessage(content=reminder),
        bash("c2", "sed -n '1255,1265p' django/db/models/base.py", "THOUGHT: read around it."),
        out("c2", "offset = 0"),
        UserMessage(content=reminder),
    ]
    text = summary(model, source, 400)
    assert "Here are some thoughts" in text, text
    assert not any(bare_line(line.split(": ", 1)[-1]) for line in lines_of(text)), text


def test_a_dialogues_bare_list_items_stay_with_what_they_list(model: ExtractiveModel) -> None:
    reply = (
        "Certainly!\nI found your reservation for the flight from ATL to JFK on May 17.\n"
        "- **Flight Number:** HAT285\n- **Cabin:** Basic Economy\n- **Price:** $54"
    )
    source: list[AnyMessage] = [
        UserMessage(content="I want to cancel my flight."),
        AssistantMessage(content=reply),
        UserMessage(content="Yes, please cancel it."),
    ]
    text = summary(model, source, 400)
    assert "HAT285" in text and "$54" in text, text
    assert not any(bare_line(line.split(": ", 1)[-1]) for line in lines_of(text)), text


def test_a_label_and_backticked_names_alone_are_bare() -> None:
    assert bare_line("Needs: `Piecewise`, `exp`") and bare_line("`printf 'x'`")
    assert not bare_line("I ran `ls` in the tests folder")


def test_a_tools_error_line_is_kept_as_the_tool_printed_it(model: ExtractiveModel) -> None:
    failing = "FAIL: test_rename_index_unnamed_index (migrations.test_operations.OperationTests)"
    source: list[AnyMessage] = [
        UserMessage(content="Fix the rename."),
        bash("c1", "./tests/runtests.py migrations", "THOUGHT: run the migration tests."),
        out("c1", f"ValueError: bad fixture in the setup of the suite\n{failing}\nFAILED (failures=1)"),
    ]
    # The call's line shows the first error; the second is the output's own line.
    assert failing in summary(model, source, 400)


def test_a_script_the_agent_writes_keeps_its_code_lines(model: ExtractiveModel) -> None:
    script = (
        "cat <<'EOF' > check_timeout.py\nimport signal\n"
        "signal.signal(signal.SIGALRM, lambda *a: (_ for _ in ()).throw(TimeoutError('Operation timed out')))\n"
        "signal.alarm(10)\nEOF\npython check_timeout.py"
    )
    source: list[AnyMessage] = [
        UserMessage(content="Find why the cdf hangs."),
        bash("c1", script, "THOUGHT: run it under an alarm."),
        out("c1", "Traceback (most recent call last):\nTimeoutError: Operation timed out"),
    ]
    text = summary(model, source, 400)
    assert "- assistant: signal.signal(signal.SIGALRM" in text, text
    assert "<<'EOF'" in text  # the call's own line still shows the command without its body


def lookup(request: str, call: ToolCall, result: object, reply: str) -> list[AnyMessage]:
    """A user's request, the agent's one call, its JSON result and the agent's reply."""
    return [
        UserMessage(content=request),
        AssistantMessage(content="", tool_calls=[call]),
        ToolMessage(tool_call_id=call.id, name=call.name, content=json.dumps(result)),
        AssistantMessage(content=reply),
    ]


USER_DETAILS = {
    "user_id": "mia_kim_4397",
    "name": {"first_name": "Mia", "last_name": "Kim"},
    "address": {"address1": "20 Elm Street", "city": "Houston", "country": "USA", "zip": "77001"},
    "email": "mia.kim@example.com",
    "dob": "1965-06-09",
    "payment_methods": {
        "gift_card_7359776": {"source": "gift_card", "amount": 39, "id": "gift_card_7359776"},
        "credit_card_4466831": {"source": "credit_card", "brand": "visa", "last_four": "1234"},
    },
    "membership": "gold",
    "reservations": ["FQ8APE", "HATHAT", "K1NW8N"],
}


def test_a_json_results_ids_and_amounts_stay_beside_their_keys(model: ExtractiveModel) -> None:
    call = ToolCall(id="c1", name="get_user_details", arguments=json.dumps({"user_id": "mia_kim_4397"}))
    source = lookup(
        "I want to pay for my new booking with my gift card.",
        call,
        USER_DETAILS,
        "Which of your payment methods would you like to use?",
    )
    text = summary(model, source, 400)
    # One line of JSON cut at 200 characters ended before the payment methods; each field is
    # its own line now, in the result's own syntax.
    payment = next((line for line in lines_of(text) if "gift_card_7359776" in line), None)
    assert payment is not None and '"payment_methods":{"gift_card_7359776":' in payment, text
    assert '"amount":39' in payment, text
    assert any('"reservations":["FQ8APE","HATHAT","K1NW8N"]' in line for line in lines_of(text)), text
    # Without the rule the result is its first 200 characters.
    plain = ExtractiveModel(TiktokenCounter(), rules=without("json_fields"))
    assert "gift_card_7359776" not in summary(plain, source, 400)


def test_json_fields_are_the_documents_own_fields_or_items() -> None:
    assert json_fields('{"a": {"b": 1}, "c": [1, 2], "d": "x"}') == ['"a":{"b":1}', '"c":[1,2]', '"d":"x"']
    assert json_fields('[{"id": "k1"}, {"id": "k2"}]') == ['{"id":"k1"}', '{"id":"k2"}']
    for other in ("returncode=0", "42", '"text"', "{not json", ""):
        assert json_fields(other) is None
    # Nested deeper than the parser goes, or nothing but brackets: read as text.
    assert json_fields("[" * 100_000 + "]" * 100_000) is None
    assert json_fields("[" * 500 + "]" * 500) is None


def _flight(number: str, business: int) -> dict[str, object]:
    return {
        "flight_number": number,
        "origin": "IAH",
        "destination": "LAS",
        "scheduled_departure_time_est": "22:00:00",
        "status": "available",
        "available_seats": {"basic_economy": 10, "economy": 11, "business": 19},
        "prices": {"basic_economy": 54, "economy": 135, "business": business},
        "date": "2024-05-24",
    }


def test_a_field_too_long_for_one_line_is_read_by_its_records() -> None:
    # Compact JSON has no space to cut at: a field longer than a line used to vanish whole
    # (a reservation's flights, a user's payment methods).
    methods = {f"card_{n}": {"source": "gift_card", "amount": 10 * n, "id": f"card_{n}"} for n in range(8)}
    lines = json_fields(json.dumps({"user_id": "u1", "payment_methods": methods}))
    assert lines is not None and lines[0] == '"user_id":"u1"'
    assert 'payment_methods.card_7: {"source":"gift_card","amount":70,"id":"card_7"}' in lines
    assert len(lines) == 1 + len(methods)
    # A search result: a list of itineraries, each a list of long records.
    search = json_fields(
        json.dumps([[_flight(f"HAT{n}", 400 + n), _flight("HAT047", 202)] for n in range(3)])
    )
    assert search is not None and len(search) == 6
    assert search[2].startswith('[1][0]: {"flight_number":"HAT1",') and '"business":401}' in search[2]
    # A record too long even alone: its own fields on its line, each nested one on its own.
    big = {"id": "r1", "note": "word " * 40, "seats": {"a": 1}, "prices": {f"p{n}": n for n in range(40)}}
    parts = json_fields(json.dumps({"record": big}))
    assert parts is not None and parts[0].startswith('record: {"id":"r1","note":"word word')
    assert 'record.seats: {"a":1}' in parts
    # An array of scalars too long for a line is cut at a word end, never a line per number.
    (numbers,) = [line for line in parts if line.startswith("record.prices")]
    assert numbers.endswith("…") and len(numbers) <= 320
    (values,) = json_fields(json.dumps({"values": list(range(200))})) or []
    assert values.startswith("values: [0, 1, 2") and values.endswith("…")
    # A key longer than a line has no line; the other fields still do.
    assert json_fields(json.dumps({"k" * 400: {"a": "x" * 400}, "b": 1})) == ['"b":1']
    assert json_fields(json.dumps({"outer": {"k" * 400: [1] * 200}})) is None


def test_the_fare_of_a_later_itinerary_is_kept(model: ExtractiveModel) -> None:
    arguments = json.dumps({"origin": "IAH", "destination": "SEA", "date": "2024-05-24"})
    call = ToolCall(id="c1", name="search_onestop_flight", arguments=arguments)
    itineraries = [[_flight(f"HAT{n}", 400 + n), _flight("HAT047", 202)] for n in range(3)]
    source = lookup(
        "Find me a business seat from IAH to SEA on May 24.",
        call,
        itineraries,
        "Three itineraries are available; which one would you like?",
    )
    text = summary(model, source, 500)
    # The first record does not fit beside the call: the call's line shows its head and the
    # record competes as a line of its own, like every later one.
    fares = [line for line in lines_of(text) if '"flight_number":"HAT2"' in line]
    assert fares and '"business":402}' in fares[0], text
    assert any('[0][0]: {"flight_number":"HAT0"' in line for line in lines_of(text)), text
    assert any(line.endswith('date="2024-05-24" -> [0][0]: …') for line in lines_of(text)), text


def test_a_crafted_deeply_nested_result_is_summarised_as_text(model: ExtractiveModel) -> None:
    call = ToolCall(id="c1", name="fetch", arguments="{}")
    source: list[AnyMessage] = [
        UserMessage(content="Fetch the record."),
        AssistantMessage(content="", tool_calls=[call]),
        ToolMessage(tool_call_id="c1", name="fetch", content="[" * 50_000 + "]" * 50_000),
    ]
    assert "Fetch the record." in summary(model, source, 200)


def test_a_shell_command_is_whole_beside_the_harness_arguments(model: ExtractiveModel) -> None:
    # An OpenHands-style shell tool takes flags beside the command; they must not push the
    # command into a short ``key=value`` list cut after its first line number.
    call = ToolCall(id="c1", name="execute_bash", arguments=json.dumps({"command": SED, "is_input": "false"}))
    source: list[AnyMessage] = [
        UserMessage(content="Rename the fields."),
        AssistantMessage(content="Apply the five edits.", tool_calls=[call]),
        ToolMessage(tool_call_id="c1", name="execute_bash", content="done"),
    ]
    text = summary(model, source, 300)
    assert any(SED in line for line in lines_of(text)), text
    assert "is_input" not in text, text


def test_the_code_an_editor_call_writes_competes_line_by_line(model: ExtractiveModel) -> None:
    # An editor writes a script through an argument, as a shell writes one through a
    # heredoc: its code lines are the agent's own (``script_lines``), what it replaced is not.
    script = "import signal\n\ndef handler(signum, frame):\n    raise TimeoutError('Operation timed out')\n\nsignal.signal(signal.SIGALRM, handler)\n"
    create = ToolCall(
        id="c1",
        name="str_replace_editor",
        arguments=json.dumps({"command": "create", "path": "/testbed/check_timeout.py", "file_text": script}),
    )
    edit = ToolCall(
        id="c2",
        name="str_replace_editor",
        arguments=json.dumps(
            {
                "command": "str_replace",
                "path": "/testbed/lib/core.py",
                "old_str": "    total = legacy_total(rows)\n    return total",
                "new_str": "    rows = [r for r in rows if r.valid]\n    total = sum(r.amount for r in rows)\n    return round_half_even(total, places=2)",
            }
        ),
    )
    source: list[AnyMessage] = [
        UserMessage(content="Make the check time out."),
        AssistantMessage(content="Write the timeout check.", tool_calls=[create]),
        ToolMessage(
            tool_call_id="c1",
            name="str_replace_editor",
            content="File created successfully at: /testbed/check_timeout.py",
        ),
        AssistantMessage(content="Use the fast path.", tool_calls=[edit]),
        ToolMessage(
            tool_call_id="c2",
            name="str_replace_editor",
            content="The file /testbed/lib/core.py has been edited.",
        ),
    ]
    text = summary(model, source, 400)
    assert "- assistant: signal.signal(signal.SIGALRM, handler)" in text, text
    assert "- assistant: raise TimeoutError('Operation timed out')" in text, text
    assert "- assistant: return round_half_even(total, places=2)" in text, text
    assert "- assistant: total = legacy_total(rows)" not in text, text
    without_rule = summary(ExtractiveModel(TiktokenCounter(), rules=without("script_lines")), source, 400)
    assert "signal.signal(signal.SIGALRM, handler)" not in without_rule, without_rule


def test_a_command_given_as_an_argument_vector_is_kept_whole(model: ExtractiveModel) -> None:
    # Codex CLI's shell takes ``["bash", "-lc", "<script>"]`` and a ``workdir``: the script is
    # the command, shown whole as the agent wrote it, and the file it edits is a file written.
    call = ToolCall(
        id="c1", name="shell", arguments=json.dumps({"command": ["bash", "-lc", SED], "workdir": "/testbed"})
    )
    source: list[AnyMessage] = [
        UserMessage(content="Rename the fields."),
        AssistantMessage(content="Apply the five edits.", tool_calls=[call]),
        ToolMessage(tool_call_id="c1", name="shell", content="done"),
    ]
    text = summary(model, source, 300)
    assert f"- tool shell: django/db/models/base.py <- bash -lc {SED} -> done" in text, text
    assert "workdir" not in text, text


def test_each_new_text_of_a_list_of_edits_competes_and_no_old_one(model: ExtractiveModel) -> None:
    edits = [
        {
            "old_string": "total = legacy_total(rows)",
            "new_string": "total = sum(r.amount for r in valid_rows)",
        },
        {"old_string": "return total", "new_string": "return round_half_even(total, places=2)"},
    ]
    call = ToolCall(
        id="c1", name="MultiEdit", arguments=json.dumps({"file_path": "/r/lib/core.py", "edits": edits})
    )
    source: list[AnyMessage] = [
        UserMessage(content="Round the totals."),
        AssistantMessage(content="Edit the total.", tool_calls=[call]),
        ToolMessage(tool_call_id="c1", name="MultiEdit", content="Applied 2 edits to /r/lib/core.py"),
    ]
    text = summary(model, source, 400)
    assert "- assistant: return round_half_even(total, places=2)" in text, text
    assert "- assistant: total = legacy_total(rows)" not in text, text
