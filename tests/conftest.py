"""Shared fixtures: synthetic tidy usage frames, the bundled real dataset, and the real CLI entry point."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

REPO = Path(__file__).resolve().parent.parent
BUNDLED = REPO / "data" / "google-2019" / "usage.csv.gz"
SHARED_BITBRAINS = REPO.parent / "shared" / "data" / "bitbrains-aug" / "usage.csv.gz"
DAY = 86400


def make_usage(
    workloads: int = 2,
    pods: int = 2,
    days: float = 3.0,
    step: int = 300,
    start: int = 1_700_000_000,
    seed: int = 0,
) -> pd.DataFrame:
    """Tidy usage with a daily cycle, noise, limits, sorted as the format says."""
    rng = np.random.default_rng(seed)
    times = np.arange(start, start + int(days * DAY), step)
    frames = []
    for w in range(workloads):
        for p in range(pods):
            phase = 2 * np.pi * (times - start) / DAY
            cpu = (w + 1) * (0.5 + 0.3 * np.sin(phase)) + rng.uniform(0, 0.05, times.size)
            memory = (w + 1) * 1e9 * (1 + 0.1 * np.sin(phase)) + rng.uniform(0, 1e7, times.size)
            frames.append(
                pd.DataFrame(
                    {
                        "timestamp": times,
                        "namespace": "ns",
                        "workload": f"w{w}",
                        "pod": f"w{w}-p{p}",
                        "container": "main",
                        "cpu_cores": cpu,
                        "memory_bytes": memory,
                        "cpu_limit_cores": 2.0 * (w + 1),
                        "memory_limit_bytes": 4e9 * (w + 1),
                    }
                )
            )
    return pd.concat(frames, ignore_index=True).sort_values(["namespace", "workload", "pod", "container", "timestamp"])


@pytest.fixture
def usage_frame() -> pd.DataFrame:
    return make_usage()


@pytest.fixture
def usage_csv(tmp_path: Path, usage_frame: pd.DataFrame) -> Path:
    path = tmp_path / "usage.csv.gz"
    usage_frame.to_csv(path, index=False)
    return path


def entry_point() -> str:
    """The installed `recommender` console script of the interpreter running the tests."""
    script = Path(sys.executable).parent / "recommender"
    if not script.exists():
        pytest.fail(f"console script {script} is missing: install the project (make test does)")
    return str(script)


Runner = Callable[..., subprocess.CompletedProcess[str]]


@pytest.fixture
def cli(tmp_path: Path) -> Runner:
    """Run `recommender ARGS...` through the real console script, in tmp_path, bounded in time."""

    def run(*args: str, timeout: float = 300, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [entry_point(), *args],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=timeout,
            env={**os.environ, **(env or {})},
            stdin=subprocess.DEVNULL,
        )

    return run
