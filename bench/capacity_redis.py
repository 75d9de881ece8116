"""``bench/capacity.py``'s Redis side: its own server, which shard's keys each command
touches (``MONITOR``), and the bytes each conversation, tenant and shared key holds
(``MEMORY USAGE``)."""

from __future__ import annotations

import shutil
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import redis

from ctxcore.state import ConversationKey
from tests.chaos.processes import answers


class RedisServer:
    """A ``redis-server`` of this bench: no persistence, stopped by its own handle."""

    def __init__(self, port: int, directory: Path) -> None:
        self.port = port
        self.directory = directory
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        if answers(self.url):
            raise SystemExit(f"capacity: port {self.port} is taken; pass another --port")
        exe = shutil.which("redis-server") or "redis-server"
        self.proc = subprocess.Popen(
            [
                exe,
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
                "--dir",
                str(self.directory),
                "--daemonize",
                "no",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 10
        while not answers(self.url):
            if time.monotonic() > deadline or self.proc.poll() is not None:
                raise SystemExit(f"capacity: redis-server on {self.port} did not start")
            time.sleep(0.05)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(10)


class Monitor:
    """``MONITOR`` in a thread: each command's keys classed as a conversation's (hash tag
    ``{tenant:conversation}``), a scheduler ring's (the tenant's ring), a tenant's (its id,
    no conversation's), or shared (Celery's queues and results). The bench's own probe commands are left out."""

    IGNORED = frozenset({"INFO", "MONITOR", "LLEN", "HLEN", "ECHO", "SCAN", "MEMORY", "PING"})

    def __init__(self, url: str, prefix: str, keys: list[ConversationKey], ignore_ports: set[int]) -> None:
        self.client = redis.Redis.from_url(url)
        # The bench's own connections (its idle checks), left out by their local port.
        self.ignore_ports = ignore_ports
        self.convs = {f"{k.tenant_id}:{k.conversation_id}" for k in keys}
        self.tenants = {k.tenant_id for k in keys}
        self.prefix = prefix
        self.counts: dict[str, int] = {
            "conversation": 0,
            "tenant": 0,
            "ring": 0,
            "shared": 0,
            "round_trips": 0,
            "in_script": 0,
        }
        self.examples: dict[str, set[str]] = {"tenant": set(), "ring": set(), "shared": set()}
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        self._ready.wait(5)

    def _run(self) -> None:
        with self.client.monitor() as m:
            self._ready.set()
            for event in m.listen():
                words = str(event["command"]).split()
                if not words:
                    continue
                name = words[0].upper()
                if name == "ECHO" and "capacity-stop" in event["command"]:
                    return
                if name in self.IGNORED or int(event.get("client_port") or 0) in self.ignore_ports:
                    continue
                # A script's own commands come as "lua": counted apart from round trips.
                self._count(name, words[1:], event.get("client_type") == "lua")

    def _count(self, name: str, args: list[str], in_script: bool) -> None:
        self.counts["in_script" if in_script else "round_trips"] += 1
        if name in ("EVALSHA", "EVAL") and len(args) >= 2 and args[1].isdigit():
            keys = args[2 : 2 + int(args[1])]
        elif name in ("MULTI", "EXEC"):
            return
        else:
            keys = args[:1]
        joined = " ".join(keys)
        if any(c in joined for c in self.convs):
            cls = "conversation"
        elif ":sched:" in joined:
            cls = "ring"  # a scheduler ring's slot: the tenant's ring (``ring_of(tenant)``)
        elif any(t in joined for t in self.tenants):
            cls = "tenant"
        else:
            cls = "shared"
        self.counts[cls] += 1
        if not in_script:
            self.counts[f"{cls}_round_trips"] = self.counts.get(f"{cls}_round_trips", 0) + 1
        if cls != "conversation":
            self.examples[cls].add(f"{name} {self._shape(joined)[: 40 if cls == 'ring' else 60]}")

    def _shape(self, text: str) -> str:
        text = text.replace(self.prefix, "P")
        for t in sorted(self.tenants, key=len, reverse=True):
            text = text.replace(t, "T")
        return text[:60]

    def stop(self) -> dict[str, Any]:
        redis.Redis.from_url(self._url()).echo("capacity-stop")
        self._thread.join(10)
        return {
            **self.counts,
            "tenant_keys": sorted(self.examples["tenant"])[:12],
            "ring_keys": sorted(self.examples["ring"])[:6],
            "shared_keys": sorted(self.examples["shared"])[:12],
        }

    def _url(self) -> str:
        kw = self.client.connection_pool.connection_kwargs
        return f"redis://{kw['host']}:{kw['port']}/0"


def memory_by_key(client: redis.Redis, prefix: str, keys: list[ConversationKey]) -> dict[str, Any]:
    """``MEMORY USAGE`` per key, grouped as the conversation's, its tenant's or shared."""
    per_conv: dict[str, int] = {}
    tenant_bytes = shared = 0
    kinds: dict[str, int] = {}
    convs = {k.conversation_id for k in keys}
    tenants = {k.tenant_id for k in keys}
    total_keys = 0
    for raw in client.scan_iter(match=f"*{prefix}*", count=1000):
        name = raw.decode(errors="replace")
        size = int(client.memory_usage(raw, samples=0) or 0)
        total_keys += 1
        conv = next((c for c in convs if c in name), None)
        kind = name.replace(prefix, "P")
        for t in tenants:
            kind = kind.replace(t, "T")
        if conv is not None:
            per_conv[conv] = per_conv.get(conv, 0) + size
            kind = kind.replace(conv, "C")
        elif any(t in name for t in tenants):
            tenant_bytes += size
        else:
            shared += size
        kinds[kind] = kinds.get(kind, 0) + size
    info = client.info("memory")
    sizes = sorted(per_conv.values())
    return {
        "keys": total_keys,
        "per_conversation_mean": sum(sizes) / max(len(sizes), 1),
        "per_conversation_max": sizes[-1] if sizes else 0,
        "tenant_keys_total": tenant_bytes,
        "shared_keys_total": shared,
        "by_key_kind": dict(sorted(kinds.items(), key=lambda kv: -kv[1])[:12]),
        "used_memory": int(info["used_memory"]),
        "used_memory_dataset": int(info.get("used_memory_dataset", 0)),
    }
