"""A child process' memory over its run, for the benchmarks: its VmRSS sampled and its log lines stamped, so a
peak can be put against the step that made it. Standard library only: the measured child is forked from this
process (see `bench.prometheus._MEASURE`)."""

from __future__ import annotations

import contextlib
import json
import resource
import subprocess
import sys
import threading
import time
from pathlib import Path

#: Seconds between two VmRSS samples of the measured child (and its descendants).
TRACE_SECONDS = 0.2


def tree_rss_kib(pid: int) -> int | None:
    """The resident memory of a process and its descendants: the sum of their PSS (each page shared after a fork
    counted once, split between its sharers; Linux's smaps_rollup), else of their VmRSS (shared pages counted in
    each: an upper bound); None once the process is gone."""
    total, found, pending = 0, False, [pid]
    while pending:
        current = pending.pop()
        try:
            children = Path(f"/proc/{current}/task/{current}/children").read_text().split()
            try:
                rollup, key = Path(f"/proc/{current}/smaps_rollup").read_text(), "Pss:"
            except OSError:
                rollup, key = Path(f"/proc/{current}/status").read_text(), "VmRSS:"
        except OSError:
            continue
        line = next((x for x in rollup.splitlines() if x.startswith(key)), None)
        if line is not None:
            total, found = total + int(line.split()[1]), True
        pending.extend(int(c) for c in children)
    return total if found else None


def trace_child(command: list[str]) -> int:
    """Run `command`, passing its output on, while sampling its VmRSS (with its descendants', `tree_rss_kib`) every
    `TRACE_SECONDS` and stamping each line it logs; then print one JSON line to stderr: the peak RSS of its largest
    process (KiB, ru_maxrss), CPU seconds (user + system), the RSS trace (seconds, MiB) and the stamped log lines
    (seconds, text), so a peak can be put against the step that made it."""
    started = time.perf_counter()
    child = subprocess.Popen(command, stderr=subprocess.PIPE, text=True, stdin=subprocess.DEVNULL)
    steps: list[tuple[float, str]] = []

    def log() -> None:
        assert child.stderr is not None
        for line in child.stderr:
            steps.append((round(time.perf_counter() - started, 2), line.rstrip()[:200]))
            sys.stderr.write(line)

    logger = threading.Thread(target=log, daemon=True)
    logger.start()
    trace: list[tuple[float, float]] = []
    while child.poll() is None:
        resident = tree_rss_kib(child.pid)
        if resident is not None:
            trace.append((round(time.perf_counter() - started, 2), round(resident / 1024, 1)))
        # Waiting, not sleeping: the wall time of a path ends when it does, not up to a sample later.
        with contextlib.suppress(subprocess.TimeoutExpired):
            child.wait(timeout=TRACE_SECONDS)
    logger.join(timeout=10)
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu_seconds = round(usage.ru_utime + usage.ru_stime, 1)
    print(
        json.dumps({"peak_kib": usage.ru_maxrss, "cpu_seconds": cpu_seconds, "trace": trace, "steps": steps}),
        file=sys.stderr,
        flush=True,
    )
    return child.returncode
