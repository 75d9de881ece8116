"""One error tree: a public raise is a ``CtxcoreError`` subclass, except inside pydantic validators.

Pydantic turns a validator's ``ValueError`` into its ``ValidationError`` (which
``validate_config`` reports as ``ConfigError``): there ``ValueError`` is the contract. An
AST walk fails on a built-in exception raised anywhere else in the modules checked.
Not yet checked (owned by other work): ``state/``, ``pipeline/``, ``processors/rules.py``,
``processors/content_rules.py`` and ``assemble.py``.
"""

from __future__ import annotations

import ast
from pathlib import Path

from ctxcore.errors import MODEL_CALL_KINDS, ErrorKind
from ctxcore.summarize.errors import ERROR_KINDS, TRANSIENT_KINDS

ROOT = Path(__file__).resolve().parents[2] / "ctxcore"
NOT_CHECKED = (
    "state/",
    "pipeline/",
    "processors/rules.py",
    "processors/content_rules.py",
    "assemble.py",
)
BUILTIN = {
    "ValueError",
    "RuntimeError",
    "TypeError",
    "KeyError",
    "LookupError",
    "IndexError",
    "OSError",
    "Exception",
}
# Functions pydantic calls as validators without a decorator (``BeforeValidator(fn)``).
UNDECORATED_VALIDATORS = {("processors/llm_support.py", "_check_client")}


def _is_validator(function: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    for decorator in function.decorator_list:
        target = decorator.func if isinstance(decorator, ast.Call) else decorator
        name = target.attr if isinstance(target, ast.Attribute) else getattr(target, "id", "")
        if name.endswith("validator"):
            return True
    return False


def builtin_raises(path: Path, relative: str) -> list[str]:
    """``file:line in function`` of each built-in exception raised outside a validator."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    found: list[str] = []

    def visit(node: ast.AST, function: ast.FunctionDef | ast.AsyncFunctionDef | None) -> None:
        for child in ast.iter_child_nodes(node):
            inner = child if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef) else function
            if isinstance(child, ast.Raise) and child.exc is not None:
                exc = child.exc.func if isinstance(child.exc, ast.Call) else child.exc
                name = exc.id if isinstance(exc, ast.Name) else ""
                in_validator = function is not None and (
                    _is_validator(function) or (relative, function.name) in UNDECORATED_VALIDATORS
                )
                if name in BUILTIN and not in_validator:
                    where = function.name if function is not None else "module level"
                    found.append(f"{relative}:{child.lineno} in {where}: raise {name}")
            visit(child, inner)

    visit(tree, None)
    return found


def test_public_raises_are_ctxcore_errors() -> None:
    bad = []
    for path in sorted(ROOT.rglob("*.py")):
        relative = str(path.relative_to(ROOT))
        if not relative.startswith(NOT_CHECKED):
            bad += builtin_raises(path, relative)
    assert bad == []


def test_the_check_finds_a_planted_raise_and_spares_validators(tmp_path: Path) -> None:
    planted = tmp_path / "m.py"
    planted.write_text(
        "from pydantic import field_validator\n"
        "class M:\n"
        "    @field_validator('x')\n"
        "    def check(cls, v):\n"
        "        raise ValueError('pydantic contract')\n"
        "def f():\n"
        "    raise RuntimeError('leaks')\n",
        encoding="utf-8",
    )
    assert builtin_raises(planted, "m.py") == ["m.py:7 in f: raise RuntimeError"]


def test_error_kinds_are_one_enum() -> None:
    assert ERROR_KINDS == MODEL_CALL_KINDS and set(ERROR_KINDS) <= set(ErrorKind)
    assert set(ERROR_KINDS) > TRANSIENT_KINDS
    assert ErrorKind.TIMEOUT == "timeout" and f"{ErrorKind.INVALID_SUMMARY}" == "invalid_summary"
