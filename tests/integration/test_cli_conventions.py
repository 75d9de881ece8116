"""The ctxcore command line's conventions: help and defaults everywhere, the shared options,
the CTXCORE_* epilog, tokens, and one-line errors naming the input for every bad input."""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
from pathlib import Path
from typing import Any

import pytest

from ctxcore.config import ModelSettings, ProxySettings, RecallSettings, Settings, TenantSettings
from tests.datasets import require_data
from workers import commands as cli_commands
from workers import eval_command
from workers.cli import build_parser, main


def subcommands(parser: argparse.ArgumentParser, path: str = "ctxcore") -> dict[str, argparse.ArgumentParser]:
    """Every (sub)command parser by its full name, nested ones (``token create``) included."""
    found = {path: parser}
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, child in action.choices.items():
                found.update(subcommands(child, f"{path} {name}"))
    return found


def required_in_group(parser: argparse.ArgumentParser) -> set[argparse.Action]:
    return {a for g in parser._mutually_exclusive_groups if g.required for a in g._group_actions}


def test_every_option_and_positional_shows_help_and_its_default() -> None:
    checked = 0
    for name, parser in subcommands(build_parser()).items():
        formatter = parser._get_formatter()
        for action in parser._actions:
            if isinstance(
                action, argparse._SubParsersAction | argparse._HelpAction | argparse._VersionAction
            ):
                continue
            text = formatter._expand_help(action) if action.help else ""
            assert text.strip(), f"{name} {action.dest}: no help"
            # Required inputs have no default to show; every other one says what it is.
            required = action.required or action in required_in_group(parser)
            if required or (not action.option_strings and action.nargs is None):
                continue
            assert "(default" in text, f"{name} {action.dest}: no default shown: {text!r}"
            checked += 1
    assert checked >= 20


def test_every_command_takes_the_shared_config_option() -> None:
    commands = {n: p for n, p in subcommands(build_parser()).items() if n != "ctxcore"}
    assert {"ctxcore eval", "ctxcore count", "ctxcore token create"} <= set(commands)
    for name, parser in commands.items():
        if name == "ctxcore token":  # a group: its action takes the options
            continue
        assert "--config" in parser._option_string_actions, name


def _leaf_names() -> set[str]:
    """Every leaf of the settings tree, walked from the model's defaults (not from the code
    that writes the epilog), as its environment variable."""

    def walk(data: dict[str, Any], prefix: str) -> set[str]:
        out: set[str] = set()
        for key, value in data.items():
            name = f"{prefix}__{key.upper()}"
            out |= walk(value, name) if isinstance(value, dict) and value else {name}
        return out

    top = walk(Settings().model_dump(exclude={"tenants"}), "CTXCORE")
    tenant = walk(
        TenantSettings(model=ModelSettings(), recall=RecallSettings(), proxy=ProxySettings()).model_dump(),
        "CTXCORE_TENANTS__<ID>",
    )
    return {n.replace("CTXCORE__", "CTXCORE_", 1) for n in top} | tenant


def test_the_help_epilog_lists_every_settings_leaf_and_the_aliases(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit) as done:
        main(["--help"])
    assert done.value.code == 0
    text = capsys.readouterr().out
    listed = {line.split()[0] for line in text.splitlines() if line.strip().startswith("CTXCORE_")}
    expected = _leaf_names() | {
        "CTXCORE_REDIS_URL",
        "CTXCORE_MODEL_BASE_URL",
        "CTXCORE_MODEL",
        "CTXCORE_CONFIG_FILE",
    }
    assert expected <= listed, sorted(expected - listed)
    assert "CTXCORE_HTTP__PORT" in listed and "CTXCORE_TENANTS__<ID>__MODEL__NAME" in listed
    assert (
        "  CTXCORE_SERVICE__TRIGGER_RATIO" in text
        and "1.0" in text.split("CTXCORE_SERVICE__TRIGGER_RATIO")[1]
    )


def test_version_and_bare_command(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as done:
        main(["--version"])
    assert done.value.code == 0 and capsys.readouterr().out.startswith("ctxcore 0.")


def test_bare_ctxcore_prints_the_short_usage_and_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as done:
        main([])
    assert done.value.code == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    lines = captured.err.splitlines()
    assert lines[0] == "usage: ctxcore COMMAND [options]"
    commands = [line.split()[0] for line in lines if line.startswith("  ")]
    assert commands == [name.split()[1] for name in subcommands(build_parser()) if name.count(" ") == 1]
    assert all(len(line) <= 100 for line in lines)  # one line each
    assert "`ctxcore --help` for more" in lines[-2]
    assert len(lines) < 20 and "CTXCORE_REDIS_URL" not in captured.err  # not the full help


def test_an_unknown_command_is_exit_2_with_the_short_usage(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as done:
        main(["compcat", "runs.jsonl"])
    assert done.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("usage: ctxcore COMMAND [options]")
    assert "  compact " in err and "invalid choice: 'compcat'" in err.splitlines()[-1]


def test_a_subcommand_error_stays_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as done:
        main(["compact", "runs.jsonl"])
    assert done.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--out" in err


def test_tables_cut_long_ids_at_the_right_with_an_ellipsis(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from workers.table_cells import cell

    assert cell("tau-airline-task0-trial0", 10) == "tau-airli…"
    assert cell("short", 8) == "short   "
    long_id = "a-conversation-id-far-longer-than-its-column-" + "x" * 40 + "-end"
    runs = tmp_path / "runs.jsonl"
    runs.write_text(json.dumps({"id": long_id, "messages": [{"role": "user", "content": "hi"}]}) + "\n")
    assert main(["count", str(runs)]) == 0
    row = capsys.readouterr().out.splitlines()[1]
    shown = row.split()[0]
    assert shown.endswith("…") and long_id.startswith(shown[:-1]) and len(shown) == cli_commands.ID_COLUMN_MAX


def test_count_reads_the_tokenizer_from_config(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cfg = tmp_path / "ctxcore.toml"
    cfg.write_text('[engine]\ntokenizer_model = "gpt-4o"\n')
    assert main(["count", "--config", str(cfg)]) == 0
    assert "encoding: o200k_base" in capsys.readouterr().out
    assert main(["count", "--config", str(cfg), "--model", "gpt-4"]) == 0
    assert "encoding: cl100k_base" in capsys.readouterr().out


# --- tokens and serve -------------------------------------------------------------------------


def test_token_create_prints_the_token_once_and_both_config_forms(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    existing = hashlib.sha256(b"old-token").hexdigest()
    monkeypatch.setenv("CTXCORE_HTTP__TOKENS", json.dumps({existing: "old-tenant"}))
    assert main(["token", "create", "acme"]) == 0
    text = capsys.readouterr().out
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    token = lines[1]
    digest = hashlib.sha256(token.encode()).hexdigest()
    assert len(token) >= 43 and text.count(token) == 1 and digest in text
    env_line = next(line for line in lines if line.startswith("CTXCORE_HTTP__TOKENS="))
    env_value = env_line.split("=", 1)[1].strip("'")
    assert "replaces the whole token map" in text
    from_env = Settings.from_env({"CTXCORE_HTTP__TOKENS": env_value})
    assert from_env.http.tokens == {existing: "old-tenant", digest: "acme"}
    toml_line = next(line for line in lines if line.startswith(f'"{digest}"'))
    cfg = tmp_path / "ctxcore.toml"
    cfg.write_text(f"[http.tokens]\n{toml_line}\n")
    assert Settings.from_file(cfg).http.tokens == {digest: "acme"}
    assert main(["token", "create", "acme"]) == 0
    assert token not in capsys.readouterr().out  # a new one every time


def test_token_create_rejects_a_bad_tenant(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["token", "create", "../etc"]) == 2
    assert "invalid tenant_id '../etc'" in capsys.readouterr().err


@pytest.mark.parametrize("configured", [False, True])
def test_serve_warns_when_no_token_is_configured(
    configured: bool, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    served: list[Settings] = []
    monkeypatch.setattr("workers.http.serve", served.append)
    monkeypatch.delenv("CTXCORE_HTTP__TOKENS", raising=False)
    if configured:
        monkeypatch.setenv("CTXCORE_HTTP__TOKENS", json.dumps({hashlib.sha256(b"t").hexdigest(): "acme"}))
    with caplog.at_level(logging.WARNING, logger="ctxcore.cli"):
        assert main(["serve", "--port", "8123"]) == 0
    assert served and served[0].http.port == 8123
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    if configured:
        assert warnings == []
    else:
        assert len(warnings) == 1 and "ctxcore token create TENANT" in warnings[0] and "401" in warnings[0]


# --- compact: bad input, atomic output ------------------------------------------------------


def write_jsonl(path: Path, records: list[Any]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def small(cid: str, words: int = 300) -> dict[str, Any]:
    return {
        "id": cid,
        "messages": [
            {"role": "user", "content": f"please fix the bug in {cid}.py"},
            {"role": "assistant", "content": "looking " * words},
            {"role": "user", "content": "thanks, and the tests?"},
            {"role": "assistant", "content": "done " * words},
        ],
    }


TOO_BIG = {"id": "huge-task", "messages": [{"role": "user", "content": "word " * 3000}]}


def leftovers(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir() if p.name.endswith(".partial"))


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        ('{"id": "a", "messages": []}\n{not json\n', "in.jsonl:2: not valid JSON"),
        ("", "in.jsonl: no conversations (the file is empty)"),
        ('{"id": "a"}\n', "in.jsonl:1: expected an object with 'messages'"),
        (
            json.dumps(small("ok")) + "\n" + json.dumps(TOO_BIG) + "\n",
            "in.jsonl:2 (id huge-task): budget of 600",
        ),
    ],
)
def test_compact_bad_input_is_one_line_naming_it_and_keeps_the_previous_out(
    content: str, expected: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    src = tmp_path / "in.jsonl"
    src.write_text(content)
    out = tmp_path / "out.jsonl"
    out.write_text("previous\n")
    assert main(["compact", str(src), "--out", str(out), "--budget", "600"]) == 2
    err = capsys.readouterr().err
    assert expected in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert out.read_text() == "previous\n" and leftovers(tmp_path) == []


@pytest.mark.parametrize("budget", ["0", "-5", "many"])
def test_compact_budget_must_be_a_positive_integer(
    budget: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    src = write_jsonl(tmp_path / "in.jsonl", [small("a")])
    with pytest.raises(SystemExit) as done:
        main(["compact", str(src), "--out", str(tmp_path / "o.jsonl"), "--budget", budget])
    assert done.value.code == 2
    err = capsys.readouterr().err
    assert "argument --budget" in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "o.jsonl").exists()


def test_compact_missing_output_directory(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    src = write_jsonl(tmp_path / "in.jsonl", [small("a")])
    assert main(["compact", str(src), "--out", str(tmp_path / "no" / "o.jsonl"), "--budget", "600"]) == 2
    assert "directory" in capsys.readouterr().err and not (tmp_path / "no").exists()


def test_compact_continue_on_error_names_each_failure_and_writes_the_rest(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    records = [small("a"), TOO_BIG, small("b"), {**TOO_BIG, "id": "huge-2"}]
    src = write_jsonl(tmp_path / "in.jsonl", records)
    out = tmp_path / "out.jsonl"
    code = main(["compact", str(src), "--out", str(out), "--budget", "600", "--continue-on-error"])
    assert code == 1
    captured = capsys.readouterr()
    assert "in.jsonl:2 (id huge-task)" in captured.err and "in.jsonl:4 (id huge-2)" in captured.err
    assert "wrote 2 windows" in captured.out and "2 conversations failed" in captured.out
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["id"] for r in rows] == ["a", "b"] and all(r["tokens_after"] <= 600 for r in rows)
    assert leftovers(tmp_path) == []


def test_ctrl_c_mid_batch_keeps_the_previous_out(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import workers.batch

    src = write_jsonl(tmp_path / "in.jsonl", [small("a"), small("b"), small("c")])
    out = tmp_path / "out.jsonl"
    out.write_text("previous\n")
    real = workers.batch._window
    calls: list[str] = []

    def interrupted(record: Any, *args: Any) -> dict[str, Any]:
        calls.append(record.id)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return real(record, *args)

    monkeypatch.setattr(workers.batch, "_window", interrupted)
    assert main(["compact", str(src), "--out", str(out), "--budget", "600"]) == 130
    assert capsys.readouterr().err.strip() == "ctxcore: interrupted"
    assert out.read_text() == "previous\n" and leftovers(tmp_path) == [] and calls == ["a", "b"]


def test_compact_replaces_out_when_the_batch_ends(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    src = write_jsonl(tmp_path / "in.jsonl", [small("a"), small("b")])
    out = tmp_path / "out.jsonl"
    out.write_text("previous\n")
    assert main(["compact", str(src), "--out", str(out), "--budget", "600"]) == 0
    assert [json.loads(line)["id"] for line in out.read_text().splitlines()] == ["a", "b"]
    assert leftovers(tmp_path) == []


# --- eval: checked before the run ------------------------------------------------------------


@pytest.fixture
def no_run(monkeypatch: pytest.MonkeyPatch) -> None:
    """Any attempt to start the evaluation fails the test: these errors come first."""

    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("the run started before the inputs were checked")

    monkeypatch.setattr("ctxcore.eval.evaluate_file", refuse)


@pytest.mark.parametrize(
    ("extra", "expected"),
    [
        (["--ids", "nosuchid"], "--ids nosuchid: no conversation nosuchid in"),
        (["--ids", "chat-1,nope"], "no conversation nope in"),
        (["--json", "/nonexistent-dir/r.json"], "--json /nonexistent-dir/r.json: directory"),
    ],
)
def test_eval_input_errors_come_before_the_run(
    extra: list[str], expected: str, no_run: None, capsys: pytest.CaptureFixture[str]
) -> None:
    data = str(require_data("dialogue_qa.jsonl"))
    assert main(["eval", data, "--policy", "truncate", "--budget", "500", *extra]) == 2
    err = capsys.readouterr().err
    assert expected in err and len(err.strip().splitlines()) == 1


def test_eval_plot_needs_the_plot_extra_and_says_so_first(
    no_run: None, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    real = eval_command.importlib.util.find_spec
    monkeypatch.setattr(
        eval_command.importlib.util, "find_spec", lambda name: None if name == "matplotlib" else real(name)
    )
    data = str(require_data("dialogue_qa.jsonl"))
    code = main(["eval", data, "--policy", "truncate", "--budget", "500", "--plot", str(tmp_path / "p.png")])
    assert code == 2 and "pip install 'ctxcore[plot]'" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("content", "expected"),
    [("", "no conversations"), ('{"messages": []}\n[oops\n', "in.jsonl:2: not valid JSON")],
)
def test_eval_bad_files(
    content: str, expected: str, no_run: None, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    src = tmp_path / "in.jsonl"
    src.write_text(content)
    assert main(["eval", str(src), "--policy", "truncate", "--budget", "500"]) == 2
    assert expected in capsys.readouterr().err


@pytest.mark.parametrize(
    "option", [["--budget", "0"], ["--budget-ratio", "-0.5"], ["--budget", "1", "--limit", "0"]]
)
def test_eval_numbers_must_be_positive(option: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as done:
        main(["eval", "x.jsonl", "--policy", "truncate", *option])
    assert done.value.code == 2 and "greater than 0" in capsys.readouterr().err
