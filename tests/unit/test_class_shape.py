"""No class of the packages is a mixin that declares its host's private attributes.

A class annotating ``_name: T`` in its body without assigning ``self._name`` anywhere in
it is the other half of a class cut across modules by inheritance: it uses attributes some
host class provides. Give it what it uses instead (``RedisCountedLog`` holds the client and
key layout its log hands it). Dataclasses and other generated initialisers assign their
annotated fields, so those fields count as assigned.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("ctxcore", "workers")
GENERATED = ("dataclass", "NamedTuple", "TypedDict", "BaseModel", "Protocol")


def _generated(cls: ast.ClassDef) -> bool:
    names = [ast.unparse(node) for node in (*cls.decorator_list, *cls.bases)]
    return any(word in name for name in names for word in GENERATED)


def _declared_not_assigned(path: Path, root: Path = ROOT) -> list[str]:
    found = []
    for cls in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if not isinstance(cls, ast.ClassDef) or _generated(cls):
            continue
        declared = [
            node.target.id
            for node in cls.body
            if isinstance(node, ast.AnnAssign)
            and node.value is None
            and isinstance(node.target, ast.Name)
            and node.target.id.startswith("_")
            and not node.target.id.startswith("__")
        ]
        assigned = {
            node.attr
            for node in ast.walk(cls)
            if isinstance(node, ast.Attribute)
            and isinstance(node.ctx, ast.Store)
            and isinstance(node.value, ast.Name)
            and node.value.id in ("self", "cls")
        }
        found += [f"{path.relative_to(root)}: {cls.name}.{name}" for name in declared if name not in assigned]
    return found


def test_no_class_declares_private_attributes_it_never_assigns() -> None:
    found = [
        hit
        for pkg in PACKAGES
        for path in sorted((ROOT / pkg).rglob("*.py"))
        for hit in _declared_not_assigned(path)
    ]
    assert found == [], "mixins declaring a host's private attributes (use composition):\n" + "\n".join(found)


def test_the_scan_finds_a_mixin(tmp_path: Path) -> None:
    module = tmp_path / "probe.py"
    module.write_text(
        "from dataclasses import dataclass\n"
        "class Mixin:\n    _client: object\n    def f(self):\n        return self._client\n"
        "class Own:\n    _client: object\n    def __init__(self):\n        self._client = 1\n"
        "@dataclass\nclass Fields:\n    _hidden: int = 0\n    _bare: int\n",
        encoding="utf-8",
    )
    assert _declared_not_assigned(module, tmp_path) == ["probe.py: Mixin._client"]
