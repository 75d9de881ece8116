"""Partition, repeated: a worker cut off from Redis while it holds a conversation's lock.

Runs the scenario of ``tests/chaos/partition.py`` (a network namespace and a veth pair of
its own; worker A inside, worker B on the host; the link cut under A's held stage, B
finishing, the link restored) ``--runs`` times and prints, per run, B's versions, the
final version, the blocks lost and doubled, and whether A's late save was refused with a
WARNING and counted. Goal: 0 lost or doubled blocks over 20 runs. Needs root; asserts
nothing.

    sudo .venv/bin/python bench/partition.py            # 20 runs, about 4 minutes
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from tests.chaos.partition import namespaces_unavailable, run_partition  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=20, help="repetitions (default 20)")
    args = parser.parse_args()
    why = namespaces_unavailable()
    if why is not None:
        print(f"cannot run: {why}", file=sys.stderr)
        return 2
    print(
        "| run | B's versions | final version | lost blocks | doubled blocks | state problems | late save refused + WARNING | conflicts counted | seconds |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    lost = doubled = refused = 0
    for run in range(1, args.runs + 1):
        started = time.monotonic()
        with tempfile.TemporaryDirectory(prefix="ctxcore-partition-") as workdir:
            o = run_partition(Path(workdir))
        ok = o.final_version == o.versions_before_restore and o.warning is not None
        lost += o.lost_blocks
        doubled += o.doubled_blocks
        refused += int(ok)
        print(
            f"| {run} | {o.versions_before_restore} | {o.final_version} | {o.lost_blocks} | {o.doubled_blocks} | "
            f"{len(o.problems)} | {'yes' if ok else 'NO'} | {o.cas_conflicts:g} | {time.monotonic() - started:.1f} |",
            flush=True,
        )
    print(
        f"\n{args.runs} runs: {lost} lost and {doubled} doubled blocks (goal 0: {'met' if lost == doubled == 0 else 'NOT met'}); "
        f"the late save refused with a WARNING in {refused} of {args.runs}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
