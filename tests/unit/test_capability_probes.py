"""No runtime capability discovery: what a seam offers is declared in its Protocol.

The scan reads the source of ``ctxcore/`` and ``workers/`` (ast) for the forms of probing:
``getattr`` with a default, ``hasattr``, ``except AttributeError``, and ``isinstance`` on a
runtime-checkable Protocol or on a backend class. A backend's own modules may test their
sibling classes (a state store recognising the log of its own database); nothing else may.
"""

from __future__ import annotations

import ast
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("ctxcore", "workers")
# A backend's own modules: they talk to one technology and may recognise its classes.
BACKEND_MODULES = (
    "ctxcore/state/memory",
    "ctxcore/state/redis",
    "ctxcore/state/sql",
    "ctxcore/state/filesystem",
    "ctxcore/summarize/openai_chat",
    "workers/redis_clients",
)
# Classes of a seam's implementations (and the drivers' own), by name.
BACKEND_PREFIXES = ("Memory", "Redis", "Sql", "Filesystem", "Tiktoken", "Estimate", "Fallback", "OpenAI")
# Findings left, each with its reason. This list may only shrink: a new finding anywhere fails
# the test.
PENDING = {
    # A ModelError from any client: only the summariser's own ModelCallError carries retry_after.
    "ctxcore/coordinator/results.py": 1,
    # The config's validator of a user-supplied ``model_client``: an in-process ModelClient
    # (a Protocol) or the keys of Settings.model; anything else is refused naming both.
    "ctxcore/processors/llm_support.py": 1,
    # os.O_NOFOLLOW does not exist on every platform (Windows).
    "ctxcore/summarize/dump.py": 1,
    # Classifying third-party exceptions (httpx, openai, the standard library) by the status,
    # response and cause attributes each library sets in its own way.
    "ctxcore/summarize/errors.py": 6,
    # Third-party objects whose shape we do not control: LangGraph's runtime (``execution_info``
    # is None outside a run and newer than some releases langchain 1.5 accepts) and Celery's
    # worker pool (None until it starts; the executor of its thread pool is not in its stubs).
    "ctxcore/integrations/langchain.py": 2,
    "workers/demo.py": 2,
}


def _checkable_protocols(trees: dict[Path, ast.Module]) -> set[str]:
    return {
        node.name
        for tree in trees.values()
        for node in ast.walk(tree)
        if isinstance(node, ast.ClassDef)
        and any(isinstance(d, ast.Name) and d.id == "runtime_checkable" for d in node.decorator_list)
    }


def _names(node: ast.expr) -> list[str]:
    items = node.elts if isinstance(node, ast.Tuple) else [node]
    return [
        i.id if isinstance(i, ast.Name) else i.attr for i in items if isinstance(i, ast.Name | ast.Attribute)
    ]


def _probe(node: ast.AST, protocols: set[str]) -> str | None:
    if isinstance(node, ast.ExceptHandler) and node.type is not None:
        return "except AttributeError" if "AttributeError" in _names(node.type) else None
    if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)):
        return None
    if node.func.id == "getattr" and len(node.args) == 3:
        return "getattr with a default"
    if node.func.id == "hasattr":
        return "hasattr"
    if node.func.id == "isinstance" and len(node.args) == 2:
        hit = [n for n in _names(node.args[1]) if n in protocols or n.startswith(BACKEND_PREFIXES)]
        return f"isinstance on {', '.join(hit)}" if hit else None
    return None


def probes(root: Path = ROOT) -> list[str]:
    """Every probe outside the backends' own modules, as ``path:line: form``."""
    trees = {
        path: ast.parse(path.read_text(encoding="utf-8"))
        for pkg in PACKAGES
        for path in sorted((root / pkg).rglob("*.py"))
    }
    protocols = _checkable_protocols(trees)
    found = []
    for path, tree in trees.items():
        name = path.relative_to(root).as_posix()
        if name.startswith(BACKEND_MODULES):
            continue
        found += [f"{name}:{n.lineno}: {form}" for n in ast.walk(tree) if (form := _probe(n, protocols))]
    return found


def test_no_capability_is_probed_at_run_time() -> None:
    found = probes()
    by_module = Counter(hit.split(":", 1)[0] for hit in found)
    new = [hit for hit in found if by_module[hit.split(":", 1)[0]] > PENDING.get(hit.split(":", 1)[0], 0)]
    assert new == [], "declare the capability in the seam's Protocol instead:\n" + "\n".join(new)
    # The pending list shrinks with the code: a module cleaned up leaves it.
    assert {m: n for m, n in PENDING.items() if by_module[m] < n} == {}


def test_the_scan_finds_every_form(tmp_path: Path) -> None:
    (tmp_path / "workers").mkdir()
    (tmp_path / "ctxcore").mkdir()
    (tmp_path / "ctxcore" / "seam.py").write_text(
        "from typing import Protocol, runtime_checkable\n@runtime_checkable\nclass Seam(Protocol): ...\n"
    )
    (tmp_path / "workers" / "user.py").write_text(
        "def f(x, store):\n"
        "    a = getattr(x, 'count', None)\n"
        "    b = hasattr(x, 'count')\n"
        "    try:\n        x.count()\n    except AttributeError:\n        pass\n"
        "    c = isinstance(x, Seam)\n"
        "    d = isinstance(store, (int, RedisStateStore))\n"
        "    e = getattr(x, 'count')\n"
        "    return isinstance(x, int)\n"
    )
    assert [hit.split(": ", 1)[1] for hit in probes(tmp_path)] == [
        "getattr with a default",
        "hasattr",
        "except AttributeError",
        "isinstance on Seam",
        "isinstance on RedisStateStore",
    ]
