"""The scorer and what it scores share no code, patterns or constants.

A compressor shaped to its scorer measures nothing: here an AST walk fails when a module of
``ctxcore/{summarize,processors,pipeline}`` imports ``ctxcore.eval``, or when a string
literal of 12 or more characters (regex patterns included; docstrings excluded) appears both
there and in ``ctxcore/eval``. Facts of tool output both sides must know are allowed by name
below, each with its reason. A planted pair of modules shows the check fails.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2] / "ctxcore"
SCORED = ("summarize", "processors", "pipeline")
MIN_CHARS = 12
# Identical literals allowed on both sides, each a fact of the outside world, not a choice.
ALLOWED: dict[str, str] = {
    "Traceback (most recent call last):": "Python's own traceback header, printed by every tool run",
    "budget_ratio": "the name of a setting both sides take (a key, not a pattern)",
    "max_result_ratio": "the name of a setting both sides take (a key, not a pattern)",
}


def _docstrings(tree: ast.AST) -> set[int]:
    ids: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                ids.add(id(body[0].value))
    return ids


def literals(path: Path) -> set[str]:
    """String constants of at least ``MIN_CHARS`` characters in a module, docstrings excluded."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    skip = _docstrings(tree)
    out: set[str] = set()
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Constant)
            and isinstance(node.value, str)
            and id(node) not in skip
            and len(node.value) >= MIN_CHARS
        ):
            out.add(node.value)
    return out


def eval_imports(path: Path) -> list[str]:
    """The imports of ``ctxcore.eval`` in a module (as written)."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    found: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [
                a.name for a in node.names if a.name == "ctxcore.eval" or a.name.startswith("ctxcore.eval.")
            ]
        elif isinstance(node, ast.ImportFrom) and node.module:
            if node.module == "ctxcore.eval" or node.module.startswith("ctxcore.eval."):
                found.append(node.module)
            elif node.module == "ctxcore" and any(a.name == "eval" for a in node.names):
                found.append("ctxcore.eval")
    return found


def shared_literals(scored: Iterable[Path], scorer: Iterable[Path]) -> dict[str, list[str]]:
    """Literals found on both sides (outside ``ALLOWED``) -> where."""
    theirs: dict[str, list[str]] = {}
    for path in scorer:
        for text in literals(path):
            theirs.setdefault(text, []).append(path.name)
    shared: dict[str, list[str]] = {}
    for path in scored:
        for text in literals(path):
            if text in theirs and text not in ALLOWED:
                shared.setdefault(text, [path.name]).extend(theirs[text])
    return shared


def _modules(*parts: str) -> list[Path]:
    return sorted(p for part in parts for p in (ROOT / part).rglob("*.py"))


def test_scored_modules_never_import_the_scorer() -> None:
    offenders = {str(p.relative_to(ROOT)): eval_imports(p) for p in _modules(*SCORED)}
    assert {k: v for k, v in offenders.items() if v} == {}


def test_scored_modules_share_no_literal_with_the_scorer() -> None:
    scored = _modules(*SCORED)
    scorer = _modules("eval")
    assert len(scored) > 20 and len(scorer) >= 8
    assert shared_literals(scored, scorer) == {}


def test_the_check_fails_on_a_planted_pair(tmp_path: Path) -> None:
    summariser = tmp_path / "summariser.py"
    summariser.write_text(
        '"""A docstring that is long enough but never counts."""\n'
        "import re\n"
        "from ctxcore.eval.probes import PROBES\n"
        "KEEP = re.compile(r'Error|Exception|FAILED')\n",
        encoding="utf-8",
    )
    scorer = tmp_path / "scorer.py"
    scorer.write_text(
        '"""A docstring that is long enough but never counts."""\n'
        "import re\n"
        "NEEDLE = re.compile(r'Error|Exception|FAILED')\n"
        "HEADER = 'Traceback (most recent call last):'\n",
        encoding="utf-8",
    )
    assert shared_literals([summariser], [scorer]) == {
        "Error|Exception|FAILED": ["summariser.py", "scorer.py"]
    }
    assert eval_imports(summariser) == ["ctxcore.eval.probes"]
