"""Cut the MIT-licensed agent-run slices in this folder from the full files (``CTXCORE_DATA_DIR``).

    CTXCORE_DATA_DIR=/path/to/data python tests/data/make_slices.py

The slices are committed: tests never read the full files. ``meta`` (rewards, gold actions)
is dropped, as in ``ctxcore/samples``; the runs bundled there are not repeated here.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
SOURCE = Path(os.environ.get("CTXCORE_DATA_DIR", HERE.parents[2] / "shared" / "data"))
# Every tenth tau-bench run (offset 5: the bundled samples are tasks 0, 3 and 9).
TAU = [f"tau-airline-task{task}-trial{trial}" for trial in range(4) for task in (5, 15, 25, 35, 45)]
# SWE runs besides the bundled sympy ones, the smaller ones first: ten whose output holds an
# exception (the probe tests need at least ten such runs) and a pytest run without one.
SWE = [
    "django__django-13837",
    "pytest-dev__pytest-7982",
    "psf__requests-5414",
    "django__django-15382",
    "matplotlib__matplotlib-25775",
    "django__django-12406",
    "pydata__xarray-4695",
    "django__django-13033",
    "pylint-dev__pylint-8898",
    "django__django-15695",
    "sympy__sympy-13878",
]
SLICES = {"tau_bench.jsonl": ("tau_bench.jsonl", TAU), "minisweagent.jsonl": ("minisweagent_dev.jsonl", SWE)}


def main() -> int:
    for name, (source, ids) in SLICES.items():
        by_id = {}
        with open(SOURCE / source, encoding="utf-8") as fh:
            for line in fh:
                record = json.loads(line)
                by_id[record["id"]] = {k: v for k, v in record.items() if k != "meta"}
        missing = [i for i in ids if i not in by_id]
        if missing:
            print(f"{SOURCE / source}: missing {missing}", file=sys.stderr)
            return 1
        text = "".join(json.dumps(by_id[i], ensure_ascii=False) + "\n" for i in ids)
        (HERE / name).write_text(text, encoding="utf-8")
        print(f"wrote {HERE / name}: {len(ids)} runs, {len(text.encode()):,} bytes")
    return 0


if __name__ == "__main__":
    sys.exit(main())
