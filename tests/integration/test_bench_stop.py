"""A benchmark stopped with SIGTERM takes the children it measures with it (none left running after it)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]


def _running(marker: str) -> list[int]:
    """Pids of live (not zombie) processes whose command line holds `marker`."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes()
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if marker.encode() in cmdline and state != "Z":
            found.append(int(entry.name))
    return found


def _wait_for(check: object, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if check():  # type: ignore[operator]
            return True
        time.sleep(0.1)
    return False


def test_sigterm_to_a_benchmark_stops_its_measured_child_and_grandchild() -> None:
    marker = f"bench-stop-{uuid.uuid4().hex}"
    # The marker reaches the measured command through the environment: only the tracing parent's and the measured
    # command's command lines hold it, not the benchmark's own.
    runner = (
        "import os, sys\n"
        "from bench.__main__ import stop_on_sigterm\n"
        "from bench.prometheus import run_child\n"
        "stop_on_sigterm()\n"
        "run_child([sys.executable, '-c', 'import time; time.sleep(120)  # ' + os.environ['MARKER']], {})\n"
    )
    outer = subprocess.Popen(
        [sys.executable, "-c", runner], cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO), "MARKER": marker}
    )
    try:
        assert _wait_for(lambda: len(_running(marker)) >= 2, 60), "the measured child never started"
        outer.send_signal(signal.SIGTERM)
        assert outer.wait(timeout=30) == 128 + signal.SIGTERM
        assert _wait_for(lambda: not _running(marker), 10), f"left running: {_running(marker)}"
    finally:
        outer.kill()
        for pid in _running(marker):
            os.kill(pid, signal.SIGKILL)
