"""A child process' memory over its run, for the benchmarks: its VmRSS sampled and its log lines stamped, so a
peak can be put against the step that made it. Standard library only: the measured child is forked from this
process (see `bench.prometheus._MEASURE`)."""

from __future__ import annotations

import json
import resource
import subprocess
import sys
import threading
import time
from pathlib import Path

#: Seconds between two VmRSS samples of the measured child.
TRACE_SECONDS = 0.5


def trace_child(command: list[str]) -> int:
    """Run `command`, passing its output on, while sampling its VmRSS every `TRACE_SECONDS` and stamping each line
    it logs; then print one JSON line to stderr: its peak RSS (KiB, ru_maxrss), CPU seconds (user + system), the VmRSS trace (seconds, MiB) and
    the stamped log lines (seconds, text), so a peak can be put against the step that made it."""
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
    status = Path(f"/proc/{child.pid}/status")
    while child.poll() is None:
        try:
            line = next((x for x in status.read_text().splitlines() if x.startswith("VmRSS:")), None)
        except OSError:
            line = None
        if line is not None:
            trace.append((round(time.perf_counter() - started, 2), round(int(line.split()[1]) / 1024, 1)))
        time.sleep(TRACE_SECONDS)
    logger.join(timeout=10)
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu_seconds = round(usage.ru_utime + usage.ru_stime, 1)
    print(
        json.dumps({"peak_kib": usage.ru_maxrss, "cpu_seconds": cpu_seconds, "trace": trace, "steps": steps}),
        file=sys.stderr,
        flush=True,
    )
    return child.returncode
