"""No module of the packages imports another module's private (underscore) name.

A name another module needs is part of its module's interface: it is public and in its
``__all__``. Dunder names (``__version__``) are not private.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("ctxcore", "workers")


def _private_imports(path: Path, root: Path = ROOT) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if not isinstance(node, ast.ImportFrom) or node.level or not node.module:
            continue
        if node.module.split(".")[0] not in PACKAGES:
            continue
        for alias in node.names:
            if alias.name.startswith("_") and not alias.name.startswith("__"):
                found.append(f"{path.relative_to(root)}:{node.lineno}: {node.module}.{alias.name}")
    return found


def test_no_private_name_is_imported_across_modules() -> None:
    found = [
        hit
        for pkg in PACKAGES
        for path in sorted((ROOT / pkg).rglob("*.py"))
        for hit in _private_imports(path)
    ]
    assert found == [], "private names imported across modules (make them public):\n" + "\n".join(found)


def test_the_scan_finds_a_private_import(tmp_path: Path) -> None:
    # The scan itself can fail: a module importing a private name is reported.
    module = tmp_path / "probe.py"
    module.write_text(
        "from ctxcore.config.base import _hidden\nfrom ctxcore import __version__\n", encoding="utf-8"
    )
    assert _private_imports(module, tmp_path) == ["probe.py:1: ctxcore.config.base._hidden"]
