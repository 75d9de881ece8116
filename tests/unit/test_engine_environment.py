"""What an engine reads at start-up, and what it shares with other engines.

* Registry: each engine holds its own (the built-ins, ``builtin_registry()``): there is no
  process-wide one; ``engine.registry.register`` affects that engine only.
* Environment: read only by ``Settings.from_env`` and ``ContextEngine.__init__`` (which
  takes ``environ``); an AST walk fails on any other read in ``ctxcore/``.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from ctxcore.engine import ContextEngine
from ctxcore.errors import ConfigError
from ctxcore.messages import UserMessage
from ctxcore.processors import ContextProcessor, ProcessorConfig, builtin_registry

ROOT = Path(__file__).resolve().parents[2] / "ctxcore"
# (file under ctxcore/, qualified function) allowed to read the environment.
READERS = {("config/settings.py", "Settings.from_env"), ("engine/engine.py", "ContextEngine.__init__")}


class _Mine(ContextProcessor[ProcessorConfig]):
    pass


def test_a_processor_registered_on_one_engine_is_unknown_to_another() -> None:
    one, other = ContextEngine(), ContextEngine()
    one.registry.register(type("TestOnlyEngineLocal", (_Mine,), {}))
    assert one.create_context("a", processors=[("TestOnlyEngineLocal", None)]).processors[0][0] == (
        "TestOnlyEngineLocal"
    )
    with pytest.raises(ConfigError, match="cannot find processor type 'TestOnlyEngineLocal'") as raised:
        other.create_context("a", processors=[("TestOnlyEngineLocal", None)])
    assert "engine.registry.register" in str(raised.value)  # says how to make it known
    assert "TestOnlyEngineLocal" not in builtin_registry()
    assert "TestOnlyEngineLocal" not in ContextEngine().registry


def test_there_is_no_process_wide_registry() -> None:
    import ctxcore.processors as processors

    one, other = ContextEngine(), ContextEngine()
    assert one.registry is not other.registry
    assert "ToolResultCap" in one.registry and "ToolResultCap" in other.registry  # built-ins in each
    assert not hasattr(processors, "REGISTRY") and not hasattr(processors, "register_processor")


def test_the_image_override_comes_from_the_environ_given() -> None:
    image = UserMessage(content=[{"type": "image_url", "image_url": {"url": "https://x/y.png"}}])
    text_only = UserMessage(content=[])
    plain = ContextEngine(environ={}).default_counter()
    priced = ContextEngine(environ={"CTXCORE_IMAGE_PLACEHOLDER_TOKENS": "7"}).default_counter()
    assert plain.count_messages([image]) - plain.count_messages([text_only]) == 1445  # unknown size
    assert priced.count_messages([image]) - priced.count_messages([text_only]) == 7


def test_a_context_gets_only_the_keys_its_processors_name() -> None:
    environ = {"TEST_ONLY_KEY": "sk-one", "OTHER_SECRET": "sk-two"}
    engine = ContextEngine(environ=environ)
    spec = {"model_client": {"name": "m", "api_key_env": "TEST_ONLY_KEY"}}
    ctx = engine.create_context("k", processors=[("RoundLevelCompressor", spec)])
    assert ctx.api_key("TEST_ONLY_KEY") == "sk-one"
    assert ctx.api_key("OTHER_SECRET") is None
    environ["TEST_ONLY_KEY"] = "changed"  # read once, at construction
    assert engine.create_context("k2", processors=[("RoundLevelCompressor", spec)]).api_key(
        "TEST_ONLY_KEY"
    ) == ("sk-one")
    assert engine.create_context("bare").api_key("TEST_ONLY_KEY") is None


def _qualified(tree: ast.Module) -> dict[int, str]:
    """id(node) -> the qualified name of the function it is in ("" at module level)."""
    where: dict[int, str] = {}

    def visit(node: ast.AST, name: str) -> None:
        for child in ast.iter_child_nodes(node):
            inner = name
            if isinstance(child, ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
                inner = f"{name}.{child.name}" if name else child.name
            where[id(child)] = inner
            visit(child, inner)

    visit(tree, "")
    return where


def environment_reads(path: Path) -> list[tuple[str, int]]:
    """(function, line) of every ``os.environ`` / ``os.getenv`` / ``os.environb`` use and
    every ``from os import environ|getenv|environb`` in a module."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    where = _qualified(tree)
    names = {"environ", "environb", "getenv", "getenvb"}
    found = []
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Attribute)
            and node.attr in names
            and isinstance(node.value, ast.Name)
            and node.value.id == "os"
        ) or (
            isinstance(node, ast.ImportFrom)
            and node.module == "os"
            and any(a.name in names for a in node.names)
        ):
            found.append((where.get(id(node), ""), node.lineno))
    return sorted(found, key=lambda hit: hit[1])


def test_only_the_two_start_ups_read_the_environment() -> None:
    bad = [
        f"{path.relative_to(ROOT)}:{line} in {function or 'module level'}"
        for path in sorted(ROOT.rglob("*.py"))
        for function, line in environment_reads(path)
        if (str(path.relative_to(ROOT)), function) not in READERS
    ]
    assert bad == []


def test_the_environment_check_finds_a_planted_read(tmp_path: Path) -> None:
    planted = tmp_path / "m.py"
    planted.write_text(
        "import os\nfrom os import getenv\nclass A:\n    def f(self):\n        return os.environ.get('X')\n"
        "def g():\n    return os.getenv('Y')\n",
        encoding="utf-8",
    )
    assert environment_reads(planted) == [("", 2), ("A.f", 5), ("g", 7)]
