"""The import structure of ``ctxcore/``: no cycle, and no import against the layer order below.

Every import statement counts, ``TYPE_CHECKING`` blocks and function-local imports included:
a cycle hidden from the interpreter is still a design cycle. A module's layer is its longest
matching prefix in ``LAYERS``; it may import modules of its own layer or of a lower one, and
the imports among all modules must form no cycle, nor those among packages. ``ctxcore``
imports nothing from ``workers``, and the imports among ``workers/`` form no cycle either,
between modules or between packages (a top-level module of ``workers/`` counts as a package
of its own). Planted graphs show the checks fail. Both orders are drawn in
``docs/architecture.md``.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable, Mapping
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# Lowest first. Each entry: (layer name, module prefixes in it).
LAYERS: list[tuple[str, tuple[str, ...]]] = [
    (
        "foundation",
        (
            "ctxcore.errors",
            "ctxcore.lazy",
            "ctxcore.markers",
            "ctxcore.messages",
            "ctxcore.json_text",
            "ctxcore.contract",
            "ctxcore.status",
            "ctxcore.telemetry",
        ),
    ),
    (
        "counting and turns",
        (
            "ctxcore.token_encodings",
            "ctxcore.token_images",
            "ctxcore.tokens",
            "ctxcore.counting",
            "ctxcore.turns",
            "ctxcore.protocol",
            "ctxcore.window_counter",
        ),
    ),
    # render (messages -> prompt text) is read by recall, summarize and the pipeline: it
    # sits below all three.
    (
        "windows and stores",
        ("ctxcore.window", "ctxcore.window_repair", "ctxcore.state", "ctxcore.render"),
    ),
    ("recall and summarisation", ("ctxcore.recall", "ctxcore.summarize")),
    ("configuration", ("ctxcore.config",)),
    ("compaction pipeline", ("ctxcore.pipeline", "ctxcore.assemble")),
    ("processors", ("ctxcore.processors",)),
    # The embedded engine is one package (a context has a store and a hook runner).
    ("engines", ("ctxcore.engine", "ctxcore.coordinator")),
    ("adapters", ("ctxcore.client", "ctxcore.integrations", "ctxcore.eval", "ctxcore.testing")),
    ("package", ("ctxcore",)),
]


def modules(root: Path, package: str = "ctxcore") -> dict[str, Path]:
    """Dotted module name -> file, for every ``.py`` file of ``package``."""
    found: dict[str, Path] = {}
    for path in sorted((root / package).rglob("*.py")):
        parts = list(path.relative_to(root).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def _resolve(name: str, known: Iterable[str]) -> str | None:
    names = set(known)
    while name and name not in names:
        name = name.rpartition(".")[0]
    return name or None


def imported(module: str, path: Path) -> set[tuple[str, str]]:
    """Every import of a module as (module written, name imported from it; "" for ``import x``),
    relative imports resolved."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    out: set[tuple[str, str]] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out |= {(alias.name, "") for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[: len(parts) - node.level + 1] + ([base] if base else []))
            out |= {(base, alias.name) for alias in node.names}
    return out


def import_graph(root: Path, package: str = "ctxcore") -> dict[str, set[str]]:
    """Module -> the modules of ``package`` it imports (``from a import b``: ``a.b`` if b is a
    module, else ``a``)."""
    known = modules(root, package)
    graph: dict[str, set[str]] = {}
    for module, path in known.items():
        targets: set[str] = set()
        for base, name in imported(module, path):
            if base != package and not base.startswith(package + "."):
                continue
            target = f"{base}.{name}" if f"{base}.{name}" in known else _resolve(base, known)
            if target is not None and target != module:
                targets.add(target)
        graph[module] = targets
    return graph


def cycles(graph: Mapping[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = 0
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph.get(start, ()))))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def layer_of(module: str) -> int:
    """The index in ``LAYERS`` of the longest prefix matching ``module``."""
    best, best_len = -1, -1
    for rank, (_, prefixes) in enumerate(LAYERS):
        for prefix in prefixes:
            if (module == prefix or module.startswith(prefix + ".")) and len(prefix) > best_len:
                best, best_len = rank, len(prefix)
    return best


def upward(graph: Mapping[str, set[str]]) -> list[str]:
    """Imports of a higher layer's module, as readable lines."""
    out = []
    for module, targets in sorted(graph.items()):
        for target in sorted(targets):
            if layer_of(target) > layer_of(module):
                out.append(
                    f"{module} ({LAYERS[layer_of(module)][0]}) imports {target} ({LAYERS[layer_of(target)][0]})"
                )
    return out


def test_every_module_has_a_layer() -> None:
    assert [m for m in modules(ROOT) if layer_of(m) < 0] == []


def test_no_import_cycle_in_ctxcore() -> None:
    assert cycles(import_graph(ROOT)) == []


def test_no_import_cycle_in_workers() -> None:
    # No layer list is kept for workers/: cycles alone are checked, here and between packages.
    assert cycles(import_graph(ROOT, "workers")) == []


def package_graph(graph: Mapping[str, set[str]]) -> dict[str, set[str]]:
    """The module graph folded to packages: ``ctxcore.pipeline.loop`` counts as ``ctxcore.pipeline``."""

    def top(module: str) -> str:
        return ".".join(module.split(".")[:2])

    folded: dict[str, set[str]] = {}
    for module, targets in graph.items():
        folded.setdefault(top(module), set()).update(top(t) for t in targets if top(t) != top(module))
    return folded


def test_no_two_packages_of_ctxcore_import_each_other() -> None:
    assert cycles(package_graph(import_graph(ROOT))) == []


def test_no_two_packages_of_workers_import_each_other() -> None:
    # A top-level module (``workers/runtime.py``) is a node of its own, a package
    # (``workers/http/``) one node for all its modules; the order is drawn in
    # docs/architecture.md.
    assert cycles(package_graph(import_graph(ROOT, "workers"))) == []


def test_a_package_cycle_is_found_where_modules_do_not_cycle(tmp_path: Path) -> None:
    root = _plant(
        tmp_path,
        {
            "ctxcore/__init__.py": "",
            "ctxcore/a/__init__.py": "",
            "ctxcore/a/one.py": "from ctxcore.b.two import X\n",
            "ctxcore/a/three.py": "",
            "ctxcore/b/__init__.py": "",
            "ctxcore/b/two.py": "",
            "ctxcore/b/four.py": "from ctxcore.a.three import Y\n",
        },
    )
    assert cycles(import_graph(root)) == []
    assert cycles(package_graph(import_graph(root))) == [["ctxcore.a", "ctxcore.b"]]


def test_no_import_against_the_layer_order() -> None:
    assert upward(import_graph(ROOT)) == []


def test_ctxcore_never_imports_workers() -> None:
    bad = [
        f"{module} imports {name}"
        for module, path in modules(ROOT).items()
        for name, _ in imported(module, path)
        if name == "workers" or name.startswith("workers.")
    ]
    assert bad == []


def _plant(tmp_path: Path, files: Mapping[str, str]) -> Path:
    for name, text in files.items():
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    return tmp_path


def test_a_cycle_through_type_checking_is_found(tmp_path: Path) -> None:
    root = _plant(
        tmp_path,
        {
            "ctxcore/__init__.py": "",
            "ctxcore/engine.py": "from ctxcore.processors.base import X\n",
            "ctxcore/processors/__init__.py": "",
            "ctxcore/processors/base.py": (
                "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from ctxcore.engine import Y\n"
            ),
        },
    )
    assert cycles(import_graph(root)) == [["ctxcore.engine", "ctxcore.processors.base"]]


def test_an_upward_import_is_found(tmp_path: Path) -> None:
    root = _plant(
        tmp_path,
        {
            "ctxcore/__init__.py": "",
            "ctxcore/messages.py": "def f():\n    from ctxcore import engine\n",
            "ctxcore/engine.py": "from .messages import f\n",
        },
    )
    graph = import_graph(root)
    assert graph["ctxcore.engine"] == {"ctxcore.messages"}  # a relative import resolves
    assert upward(graph) == ["ctxcore.messages (foundation) imports ctxcore.engine (engines)"]
    assert cycles(graph) == [["ctxcore.engine", "ctxcore.messages"]]
