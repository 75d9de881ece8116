"""Every ``Settings`` field does something: each is read outside ``ctxcore/config/``.

The check is by name: an attribute read ``.<field>`` anywhere in ``ctxcore/`` (but its
``config/`` package, where validators and helpers read them) or ``workers/``. It cannot
tell ``logging.format`` from ``str.format``, but it catches the field nobody ever reads,
which is how ``retention_days`` and ``default_budget`` went dead (issue 20, item 7).
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path
from typing import get_args, get_origin

from pydantic import BaseModel

from ctxcore.config import Settings
from ctxcore.config.sources import section_of

REPO = Path(__file__).resolve().parents[2]
# path -> why it may stay unread; an entry that is read (or gone) fails, so the list shrinks.
ALLOWED = {
    # The broker's own consumer_timeout (rabbitmq.conf), declared so WorkerSettings refuses a
    # hard_time_limit plus retry countdown the broker would cut; nothing else can use it
    # (the x-consumer-timeout queue argument would break redeclaring existing queues).
    "worker.consumer_timeout": "declares rabbitmq.conf's value for WorkerSettings._limits",
}


def leaves(model: type[BaseModel], prefix: str = "") -> Iterator[str]:
    """Dotted path of every field of the tree, sections included (``<id>`` for a tenant)."""
    for name, info in model.model_fields.items():
        yield f"{prefix}{name}"
        args = get_args(info.annotation)
        if get_origin(info.annotation) is dict and len(args) == 2 and (entry := section_of(args[1])):
            yield from leaves(entry, f"{prefix}{name}.<id>.")
        elif section := section_of(info.annotation):
            yield from leaves(section, f"{prefix}{name}.")


def attribute_reads(roots: list[Path], skip: Path) -> set[str]:
    """Names of every attribute loaded in the Python files under ``roots``, but ``skip``'s."""
    names: set[str] = set()
    for root in roots:
        for path in root.rglob("*.py"):
            if path.is_relative_to(skip):
                continue
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
                if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Load):
                    names.add(node.attr)
    return names


def unread(model: type[BaseModel], roots: list[Path], skip: Path) -> list[str]:
    reads = attribute_reads(roots, skip)
    return [path for path in leaves(model) if path.rsplit(".", 1)[-1] not in reads]


def test_every_setting_is_read_outside_the_config_package() -> None:
    found = unread(Settings, [REPO / "ctxcore", REPO / "workers"], REPO / "ctxcore" / "config")
    assert [path for path in found if path not in ALLOWED] == []
    # An allowed field that is now read (or renamed) leaves the list.
    assert sorted(set(ALLOWED) - set(found)) == []


def test_the_check_finds_a_field_only_the_config_reads(tmp_path: Path) -> None:
    class Section(BaseModel):
        used: int = 1
        dead: int = 2

    class Tree(BaseModel):
        section: Section = Section()

    (tmp_path / "config").mkdir()
    (tmp_path / "config" / "tree.py").write_text("def check(s):\n    return s.section.dead\n")
    (tmp_path / "app.py").write_text(
        "def run(settings):\n    settings.section.used = 3\n    return settings.section\n"
    )
    assert unread(Tree, [tmp_path], tmp_path / "config") == ["section.used", "section.dead"]
    (tmp_path / "app.py").write_text("def run(settings):\n    return settings.section.used\n")
    assert unread(Tree, [tmp_path], tmp_path / "config") == ["section.dead"]
