"""Re-cut the bundled Google 2019 trace so that every job is live at its end (issue 39, item 4).

The trace's four jobs do not overlap in time: two of them ended 17-24 days before the file's last sample, so the
demo, which decides at the data's end, showed them stale. This moves each job forward by whole 5-minute steps until
its last sample lies in the 5-minute step of the file's last sample (the step the decision follows), so every job's
data ends in the same step; samples keep their place on the grid, and every other cell is left byte for byte. A
job's own time series is unchanged; only when it ran relative to the others moves (the trace's day boundaries are
arbitrary anyway: data/google-2019/SOURCE.md). Idempotent: on the re-cut file it changes nothing.

    .venv/bin/python scripts/align_bundled_data.py [data/google-2019/usage.csv.gz]
"""

from __future__ import annotations

import gzip
import sys
from collections import defaultdict
from pathlib import Path

STEP_SECONDS = 300
DEFAULT = Path(__file__).resolve().parent.parent / "data" / "google-2019" / "usage.csv.gz"


def shifts(rows: list[list[str]]) -> dict[str, int]:
    """Per workload, the whole steps that move its last sample into the step of the file's last sample."""
    last: dict[str, int] = defaultdict(int)
    for row in rows:
        last[row[2]] = max(last[row[2]], int(row[0]))
    end = max(last.values()) // STEP_SECONDS
    return {workload: (end - newest // STEP_SECONDS) * STEP_SECONDS for workload, newest in last.items()}


def main(path: Path) -> None:
    text = gzip.decompress(path.read_bytes()).decode()
    header, *lines = text.splitlines()
    if header.split(",")[:3] != ["timestamp", "namespace", "workload"]:
        raise SystemExit(f"{path}: expected the columns timestamp,namespace,workload first, found {header!r}")
    # Only the first cell changes: split once, so every other cell keeps its exact text.
    rows = [line.split(",", 3) for line in lines]
    moved = shifts(rows)
    out = [header, *(",".join([str(int(r[0]) + moved[r[2]]), *r[1:]]) for r in rows)]
    # mtime=0: the same input gives the same bytes.
    path.write_bytes(gzip.compress(("\n".join(out) + "\n").encode(), compresslevel=9, mtime=0))
    for workload, seconds in sorted(moved.items()):
        print(f"{workload}: moved {seconds} s ({seconds / 86400:.2f} days)")


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else DEFAULT)
