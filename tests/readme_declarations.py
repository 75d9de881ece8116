"""The README's walk-throughs and what each declares it starts and reuses.

A walk-through is a ``###`` (or ``##``) section with fenced ``bash`` / ``python`` blocks and a
declaration paragraph ``**Starts:** ... **Reuses:** ... **Python:** ...``: the ports it
starts (``port 8099``), the ports and exported variables of earlier walk-throughs it reuses,
and whether its Python continues the previous session. Sections with blocks that are not
walk-throughs are listed, with the reason, in ``SKIPPED``.

``check_declarations`` compares each declaration with the blocks (no process started):

- a background line (``... &``) with a port starts it: the port must be in **Starts**, and
  every **Starts** port must be started so;
- any other port a block names (``127.0.0.1:N``, ``--port N``, ``PORT=N``) must be started
  or reused by the walk-through, a reused one started by an earlier walk-through (or be
  provided, like the reader's Redis), and no port is started twice;
- a variable a block reads (``$X``, ``os.environ["X"]``) that an earlier walk-through
  exported and this one does not must be named in **Reuses**.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

__all__ = [
    "SKIPPED",
    "Declaration",
    "ReadmeRunFailed",
    "Section",
    "check_declarations",
    "parse_sections",
    "walk_throughs",
]

# Sections whose blocks are not run, and why (a section named here must exist).
SKIPPED = {
    "Quickstart": "pip install and pytest are the test run itself; tests/integration/test_demo.py runs the demo",
    "Distributed": "a list of commands and configuration forms, not a walk-through",
    "A local summarisation model": "needs the local-model extra (a compiled llama.cpp); "
    "tests/integration/test_real_model.py starts the same server and compacts through it",
}

_PORT_USE = re.compile(r"(?:127\.0\.0\.1:|localhost:|--port[ =]|PORT=)(\d{2,5})\b")
_DECLARED_PORT = re.compile(r"\bports? (\d{2,5})\b")
_NAME = re.compile(r"`([A-Z][A-Z0-9_]{2,})`")
_READS = re.compile(r"\$\{?([A-Z][A-Z0-9_]+)|os\.environ(?:\.get\(|\[)\s*[\"']([A-Z][A-Z0-9_]+)")
_EXPORTS = re.compile(r"^\s*export\s+(.+)$", re.MULTILINE)
_DECLARATION = re.compile(
    r"\*\*Starts:\*\*(?P<starts>.*?)\*\*Reuses:\*\*(?P<reuses>.*?)\*\*Python:\*\*(?P<python>.*?)(?:\n\n|\n```|\Z)",
    re.DOTALL,
)


class ReadmeRunFailed(AssertionError):
    """The README, followed as written, did not work (the message says where and why)."""


@dataclass(frozen=True)
class Block:
    lang: str
    code: str


@dataclass(frozen=True)
class Declaration:
    starts: frozenset[str]
    reuses: frozenset[str]
    reused_names: frozenset[str]
    continues_python: bool


@dataclass
class Section:
    title: str
    blocks: list[Block]
    declaration: Declaration | None

    @property
    def bash(self) -> list[str]:
        return [b.code for b in self.blocks if b.lang == "bash"]

    @property
    def python(self) -> list[str]:
        return [b.code for b in self.blocks if b.lang == "python"]


def parse_sections(text: str) -> list[Section]:
    """The ``##`` / ``###`` sections of a Markdown text, with their fenced blocks and declaration."""
    parts = re.split(r"^#{2,3} (.+)$", text, flags=re.MULTILINE)
    sections = []
    for title, body in zip(parts[1::2], parts[2::2], strict=True):
        blocks = [
            Block(lang, code)
            for lang, code in re.findall(r"^```(\w+)\n(.*?)^```$", body, flags=re.MULTILINE | re.DOTALL)
        ]
        found = _DECLARATION.search(body)
        declaration = None
        if found:
            reuses = found["reuses"]
            declaration = Declaration(
                starts=frozenset(_DECLARED_PORT.findall(found["starts"])),
                reuses=frozenset(_DECLARED_PORT.findall(reuses)),
                reused_names=frozenset(_NAME.findall(reuses)),
                continues_python=found["python"].strip().startswith("continues"),
            )
        sections.append(Section(title.strip(), blocks, declaration))
    return sections


def _without_comments(code: str) -> list[str]:
    return [re.sub(r"\s+#.*$", "", line) for line in code.splitlines()]


def _started_ports(section: Section) -> set[str]:
    return {
        port
        for code in section.bash
        for line in _without_comments(code)
        if line.rstrip().endswith("&") and not line.rstrip().endswith("&&")
        for port in _PORT_USE.findall(line)
    }


def _exported(section: Section) -> set[str]:
    names: set[str] = set()
    for code in section.bash:
        for rest in _EXPORTS.findall(code):
            names.update(re.findall(r"(?:^|\s)([A-Z][A-Z0-9_]+)=", rest))
    return names


def _reads(section: Section) -> set[str]:
    return {a or b for code in (b.code for b in section.blocks) for a, b in _READS.findall(code)}


def walk_throughs(sections: list[Section]) -> list[Section]:
    """The sections that are run: those with blocks, but the skipped ones."""
    return [s for s in sections if s.blocks and s.title not in SKIPPED]


def check_declarations(text: str, provided: frozenset[str] = frozenset({"6379"})) -> list[str]:
    """Each walk-through's declaration against its blocks; the problems found (none: [])."""
    sections = parse_sections(text)
    problems = [
        f"SKIPPED names “{title}”, which the README no longer has"
        for title in SKIPPED
        if title not in {s.title for s in sections}
    ]
    started_by: dict[str, str] = {}
    exported_by: dict[str, str] = {}
    for section in walk_throughs(sections):
        name, declared = section.title, section.declaration
        if declared is None:
            problems.append(f"“{name}” runs blocks but does not say what it starts and reuses")
            continue
        started = _started_ports(section)
        used = {p for b in section.blocks for p in _PORT_USE.findall(b.code)}
        for port in sorted(started - declared.starts):
            problems.append(f"“{name}” starts port {port} without saying so under Starts")
        for port in sorted(declared.starts - started):
            problems.append(f"“{name}” says it starts port {port} but no background line does")
        for port in sorted(declared.starts & started_by.keys()):
            problems.append(f"“{name}” starts port {port}, already started by “{started_by[port]}”")
        for port in sorted(used - declared.starts - declared.reuses):
            problems.append(f"“{name}” uses port {port} without saying it starts or reuses it")
        for port in sorted(declared.reuses - started_by.keys() - provided):
            problems.append(f"“{name}” reuses port {port}, which no earlier walk-through starts")
        own = _exported(section)
        for var in sorted((_reads(section) - own) & exported_by.keys() - declared.reused_names):
            problems.append(
                f"“{name}” reads {var}, exported by “{exported_by[var]}”, without saying it reuses it"
            )
        started_by.update(dict.fromkeys(declared.starts, name))
        exported_by.update(dict.fromkeys(own, name))
    return problems
