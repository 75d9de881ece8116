"""What Redis operations cost, from the server's own counters: a reading of ``INFO
commandstats`` / ``stats`` / ``cpu`` at one instant, and the deltas between readings summed
per kind of operation (``bench/capacity.py``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import redis


@dataclass
class Reading:
    """Server-wide counters at one instant (INFO's own command left out)."""

    cmds: dict[str, int]
    usec: int
    bytes_in: int
    bytes_out: int
    cpu_s: float


def read(client: redis.Redis) -> Reading:
    info: dict[str, Any] = client.execute_command("INFO", "commandstats", "stats", "cpu")
    cmds: dict[str, int] = {}
    usec = 0
    for name, value in info.items():
        if name.startswith("cmdstat_") and name != "cmdstat_info":
            cmds[name.removeprefix("cmdstat_")] = int(value["calls"])
            usec += int(value["usec"])
    return Reading(
        cmds,
        usec,
        int(info["total_net_input_bytes"]),
        int(info["total_net_output_bytes"]),
        float(info["used_cpu_user"]) + float(info["used_cpu_sys"]),
    )


@dataclass
class Cost:
    """Accumulated deltas of one kind of operation."""

    ops: int = 0
    cmds: float = 0.0
    bytes_in: float = 0.0
    bytes_out: float = 0.0
    usec: float = 0.0
    cpu_s: float = 0.0
    by_command: dict[str, float] = field(default_factory=dict)

    def add(
        self, a: Reading, b: Reading, overhead: Cost | None = None, ops: int = 1, times: float = 1.0
    ) -> None:
        """Add the delta ``a -> b`` for ``ops`` operations, minus ``times`` x ``overhead`` (per-op means)."""
        self.ops += ops
        o = overhead or Cost(ops=1)
        for name in set(a.cmds) | set(b.cmds):
            d = (
                b.cmds.get(name, 0)
                - a.cmds.get(name, 0)
                - times * o.by_command.get(name, 0.0) / max(o.ops, 1)
            )
            if d:
                self.by_command[name] = self.by_command.get(name, 0.0) + d
        self.cmds += sum(b.cmds.values()) - sum(a.cmds.values()) - times * o.cmds / max(o.ops, 1)
        self.bytes_in += b.bytes_in - a.bytes_in - times * o.bytes_in / max(o.ops, 1)
        self.bytes_out += b.bytes_out - a.bytes_out - times * o.bytes_out / max(o.ops, 1)
        self.usec += b.usec - a.usec - times * o.usec / max(o.ops, 1)
        self.cpu_s += b.cpu_s - a.cpu_s - times * o.cpu_s / max(o.ops, 1)

    def per(self, n: float | None = None) -> dict[str, float]:
        """Means per operation (or per ``n``)."""
        d = n if n is not None else self.ops
        d = d if d > 0 else 1.0  # nothing measured: the totals, not a division by zero
        return {
            "cmds": self.cmds / d,
            "bytes_in": self.bytes_in / d,
            "bytes_out": self.bytes_out / d,
            "usec": self.usec / d,
            "cpu_s": self.cpu_s / d,
        }

    def top(self, n: float | None = None, k: int = 6) -> str:
        d = n if n is not None else self.ops
        d = d if d > 0 else 1.0
        ranked = sorted(self.by_command.items(), key=lambda kv: -kv[1])[:k]
        return " ".join(f"{name}={v / d:.2f}" for name, v in ranked if v / d >= 0.005)
