"""Runs the README's walk-throughs as one reader would: top to bottom, in one shell.

``run_readme`` runs them, after ``check_declarations``, as a reader does: one ``bash`` for
every ``bash`` block (its background processes stay up), a Python session per walk-through
started from that shell (its environment, one of its background jobs) (kept when the walk-through continues the previous one; otherwise a new one,
so a name of an earlier session used silently is a ``NameError``). Before a walk-through
starts a port, nothing may listen there (a clash with an earlier walk-through or with
something else fails, naming it); afterwards it must listen, and a background process that
exited at any time fails the run with its log. Everything runs in one process group, which
is stopped at the end.

What differs from a reader, and why: every port a walk-through starts is replaced by a free
one, consistently in every block (the README's "A port already taken" advice: parallel runs
on one machine share the ports), ``.venv/bin/`` is the running interpreter's, the Redis URL
is the test's, and ``CTXCORE_REDIS__KEY_PREFIX`` gives the run keys of its own (deleted after).

What a walk-through is and what its declaration says: ``tests/readme_declarations.py``.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from tests.readme_declarations import ReadmeRunFailed, check_declarations, parse_sections, walk_throughs

__all__ = ["ReadmeRun", "ReadmeRunFailed", "run_readme"]

_SESSION = r"""
import json, os, sys, traceback
namespace = {"__name__": "__main__"}
for line in sys.stdin:
    request = json.loads(line)
    try:
        exec(compile(request["code"], request["name"], "exec"), namespace)
        status = {"ok": True}
    except BaseException:
        status = {"ok": False, "error": traceback.format_exc()}
    sys.stdout.flush(); sys.stderr.flush()
    with open(request["status"] + ".tmp", "w") as fh:
        json.dump(status, fh)
    os.replace(request["status"] + ".tmp", request["status"])
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _listening(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex(("127.0.0.1", port)) == 0


def _tail(path: Path, chars: int = 4000) -> str:
    return path.read_text(errors="replace")[-chars:] if path.exists() else ""


@dataclass
class ReadmeRun:
    """What a run left to look at: its logs, the ports used, the Python outputs."""

    workdir: Path
    ports: dict[str, int]
    key_prefix: str
    python_output: str = ""
    finished: list[str] = field(default_factory=list)

    @property
    def shell_log(self) -> str:
        return (self.workdir / "shell.log").read_text(errors="replace")


class _Reader:
    """One shell and the current Python session, in one process group."""

    def __init__(self, workdir: Path, env: dict[str, str], cwd: Path, block_timeout: float) -> None:
        self.workdir = workdir
        self.cwd = cwd
        self.block_timeout = block_timeout
        self.counter = 0
        self.log = workdir / "shell.log"
        self.shell = subprocess.Popen(
            ["bash", "--norc", "--noprofile"],
            stdin=subprocess.PIPE,
            stdout=self.log.open("w"),
            stderr=subprocess.STDOUT,
            cwd=cwd,
            env=env,
            start_new_session=True,
            text=True,
        )
        self.session_script = workdir / "readme_session.py"
        self.session_script.write_text(_SESSION)
        self.session_in: int | None = None
        self.session_pid: int | None = None
        self.session_log: Path | None = None
        self.send("set -e")

    def send(self, command: str) -> None:
        assert self.shell.stdin is not None
        self.shell.stdin.write(command + "\n")
        self.shell.stdin.flush()

    def _wait_for(self, path: Path, what: str, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while not path.exists():
            if self.shell.poll() is not None:
                raise ReadmeRunFailed(
                    f"{what}: the shell exited ({self.shell.returncode})\n{_tail(self.log)}"
                )
            if time.monotonic() > deadline:
                raise ReadmeRunFailed(f"{what}: not done within {timeout:.0f} s\n{_tail(self.log)}")
            time.sleep(0.05)

    def run_bash(self, code: str, what: str) -> None:
        self.counter += 1
        script = self.workdir / f"block{self.counter}.sh"
        script.write_text(code)
        done = self.workdir / f"block{self.counter}.done"
        self.send(f"source {script}; touch {done}")
        self._wait_for(done, what, self.block_timeout)

    def jobs(self) -> tuple[list[str], list[str]]:
        """(running, ended) background jobs of the shell, as ``jobs -l`` prints them."""
        self.counter += 1
        out = self.workdir / f"jobs{self.counter}"
        self.send(f"jobs -l > {out}.tmp; mv {out}.tmp {out}")
        self._wait_for(out, "listing the shell's jobs", 10)
        lines = [line for line in out.read_text().splitlines() if re.match(r"\[\d+\]", line)]
        running = [line for line in lines if " Running " in line]
        return running, [line for line in lines if line not in running]

    def check_jobs(self, what: str) -> None:
        _, ended = self.jobs()
        ended = [line for line in ended if self.session_script.name not in line]
        if ended:
            raise ReadmeRunFailed(
                f"{what}: a background process it started exited:\n"
                + "\n".join(ended)
                + f"\n--- shell log ---\n{_tail(self.log)}"
            )

    def _session_alive(self) -> bool:
        if self.session_pid is None:
            return False
        try:
            stat = Path(f"/proc/{self.session_pid}/stat").read_text()
        except OSError:
            return False
        return stat.rsplit(")", 1)[1].split()[0] != "Z"

    def new_session(self) -> None:
        """A new ``python`` started from the shell, as a reader starts one: it gets the
        shell's exported variables and is one of its background jobs."""
        self.close_session()
        self.counter += 1
        fifo = self.workdir / f"python{self.counter}.in"
        os.mkfifo(fifo)
        self.session_log = self.workdir / f"python{self.counter}.log"
        pidfile = self.workdir / f"python{self.counter}.pid"
        self.run_bash(
            f"{sys.executable} -u {self.session_script} < {fifo} > {self.session_log} 2>&1 & echo $! > {pidfile}",
            "starting a Python session",
        )
        self.session_pid = int(pidfile.read_text())
        deadline = time.monotonic() + 30
        while self.session_in is None:
            try:  # no reader yet: ENXIO
                self.session_in = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
            except OSError:
                if time.monotonic() > deadline or not self._session_alive():
                    raise ReadmeRunFailed(
                        f"the Python session did not start\n{_tail(self.session_log)}"
                    ) from None
                time.sleep(0.05)
        os.set_blocking(self.session_in, True)

    def run_python(self, code: str, what: str) -> None:
        if self.session_in is None or self.session_log is None:
            raise ReadmeRunFailed(f"{what}: no Python session")
        self.counter += 1
        status = self.workdir / f"status{self.counter}.json"
        request = {"code": code, "name": what, "status": str(status)}
        os.write(self.session_in, (json.dumps(request) + "\n").encode())
        deadline = time.monotonic() + self.block_timeout
        while not status.exists():
            if not self._session_alive() or time.monotonic() > deadline:
                raise ReadmeRunFailed(f"{what}: the Python session stopped\n{_tail(self.session_log)}")
            time.sleep(0.05)
        result = json.loads(status.read_text())
        if not result["ok"]:
            raise ReadmeRunFailed(f"{what} raised:\n{result['error']}")

    def close_session(self) -> None:
        """End of input: the session exits (killed after 15 s)."""
        if self.session_in is None:
            return
        os.close(self.session_in)
        self.session_in = None
        deadline = time.monotonic() + 15
        while self._session_alive() and time.monotonic() < deadline:
            time.sleep(0.05)
        if self._session_alive() and self.session_pid is not None:
            os.kill(self.session_pid, signal.SIGKILL)
        self.session_pid = None

    def stop(self) -> None:
        """Stop the session, then every process of the group (SIGTERM, then SIGKILL)."""
        try:
            self.close_session()
        finally:
            pgid = self.shell.pid
            for sig, grace in ((signal.SIGTERM, 25.0), (signal.SIGKILL, 5.0)):
                try:
                    os.killpg(pgid, sig)
                except ProcessLookupError:
                    break
                deadline = time.monotonic() + grace
                while time.monotonic() < deadline:
                    self.shell.poll()
                    try:
                        os.killpg(pgid, 0)
                    except ProcessLookupError:
                        break
                    time.sleep(0.1)
            self.shell.wait(5)


def _substitute(code: str, ports: dict[str, int], redis_url: str, venv_bin: str) -> str:
    for old, new in ports.items():
        code = re.sub(rf"(?<!\d){old}(?!\d)", str(new), code)
    code = code.replace("redis://127.0.0.1:6379/0", redis_url)
    return code.replace(".venv/bin/", venv_bin + "/")


def run_readme(
    text: str,
    workdir: Path,
    *,
    redis_url: str,
    repo: Path,
    key_prefix: str | None = None,
    static_checks: bool = True,
    block_timeout: float = 120.0,
    port_timeout: float = 60.0,
) -> ReadmeRun:
    """Run the walk-throughs of ``text`` top to bottom; raises ``ReadmeRunFailed``."""
    if static_checks and (problems := check_declarations(text)):
        raise ReadmeRunFailed("the README's declarations do not match its blocks:\n" + "\n".join(problems))
    sections = walk_throughs(parse_sections(text))
    declared = sorted({p for s in sections if s.declaration for p in s.declaration.starts})
    ports = {p: _free_port() for p in declared}
    run = ReadmeRun(workdir, ports, key_prefix or f"readme{uuid.uuid4().hex[:8]}")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CTXCORE_", "OPENAI_"))}
    env.update({"CTXCORE_REDIS__KEY_PREFIX": run.key_prefix, "PYTHONUNBUFFERED": "1"})
    venv_bin = str(Path(sys.executable).parent)
    started_by: dict[str, str] = {}
    reader = _Reader(workdir, env, repo, block_timeout)
    try:
        for section in sections:
            name = section.title
            if section.declaration is None:
                raise ReadmeRunFailed(f"“{name}” does not say what it starts and reuses")
            for port in sorted(section.declaration.starts):
                if _listening(ports[port]):
                    owner = (
                        f"by walk-through “{started_by[port]}”"
                        if port in started_by
                        else "by something else (README: 'A port already taken')"
                    )
                    raise ReadmeRunFailed(
                        f"“{name}” starts port {port} (here {ports[port]}), already taken {owner}"
                    )
            for n, code in enumerate(section.bash):
                reader.run_bash(_substitute(code, ports, redis_url, venv_bin), f"“{name}” bash block {n + 1}")
            deadline = time.monotonic() + port_timeout
            for port in sorted(section.declaration.starts):
                while not _listening(ports[port]):
                    reader.check_jobs(f"“{name}” starting port {port}")
                    if time.monotonic() > deadline:
                        raise ReadmeRunFailed(
                            f"“{name}” said it starts port {port} (here {ports[port]}); nothing listens "
                            f"there after {port_timeout:.0f} s\n{_tail(reader.log)}"
                        )
                    time.sleep(0.2)
                started_by[port] = name
            reader.check_jobs(f"“{name}”")
            if section.python:
                if not section.declaration.continues_python or reader.session_in is None:
                    reader.new_session()
                for n, code in enumerate(section.python):
                    reader.run_python(
                        _substitute(code, ports, redis_url, venv_bin), f"README “{name}” python block {n + 1}"
                    )
            reader.check_jobs(f"“{name}”")
            run.finished.append(name)
    finally:
        reader.stop()
        logs = sorted(workdir.glob("python*.log"), key=lambda p: int(p.stem.removeprefix("python")))
        run.python_output = "".join(p.read_text(errors="replace") for p in logs)
    return run
