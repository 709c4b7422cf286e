"""Issue 39, items 8 and 9, through the real CLI and a real server: a workload that resumes after a long gap gets no
recommendation from its old history (it was sized from one new sample and OOM-killed at start), and a memory limit
never lands under a peak of the history window (one 10 days old was cut to half of it)."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pandas as pd
import pytest

from recommender.units import MIB, memory_bytes_from_quantity
from tests import k8s
from tests.conftest import DAY, Runner
from tests.integration.test_serving_tls import tls_client, train

pytestmark = pytest.mark.integration
GIB = 1024 * MIB
STEP = 300
#: A 5-minute step: every sample time below is on this grid.
PEAK_BYTES = 1220 * MIB


def rows(workload: str, times: np.ndarray, memory_bytes: np.ndarray, memory: tuple[float, float]) -> pd.DataFrame:
    return pd.DataFrame(
        {
            "timestamp": times,
            "namespace": "ns",
            "workload": workload,
            "pod": f"{workload}-1",
            "container": "main",
            "cpu_cores": 0.4,
            "memory_bytes": memory_bytes,
            "cpu_request_cores": 0.5,
            "cpu_limit_cores": 1.0,
            "memory_request_bytes": memory[0],
            "memory_limit_bytes": memory[1],
        }
    )


def resumed(end: int, new_samples: int = 1) -> pd.DataFrame:
    """Item 8: 3 days (peak 1,220 MiB) ending 20 days before `end`, then `new_samples` of 50 MiB up to `end`."""
    old = np.arange(end - 23 * DAY, end - 20 * DAY, STEP)
    memory = np.full(old.size, 800.0 * MIB)
    memory[old.size // 2] = PEAK_BYTES
    new = end - STEP * np.arange(new_samples)[::-1]
    limits = (1280.0 * MIB, 1372.0 * MIB)
    return pd.concat(
        [rows("resumed", old, memory, limits), rows("resumed", new, np.full(new.size, 50.0 * MIB), limits)]
    )


def old_peak(end: int) -> pd.DataFrame:
    """Item 9: 15 days at 1 GiB with one 8 GiB peak 10 days before `end`."""
    times = np.arange(end - 15 * DAY, end + 1, STEP)
    memory = np.full(times.size, 1.0 * GIB)
    memory[np.searchsorted(times, end - 10 * DAY)] = 8 * GIB
    return rows("old-peak", times, memory, (4.0 * GIB, 4.0 * GIB))


def recommend(cli: Runner, tmp_path: Path, frame: pd.DataFrame, as_of: int) -> dict[str, Any]:
    frame.to_csv(tmp_path / "usage.csv", index=False)
    done = cli("recommend", "--input", "usage.csv", "--as-of", str(as_of), "--output", "out.json")
    assert done.returncode == 0, done.stderr
    [rec] = json.loads((tmp_path / "out.json").read_text())["recommendations"]
    return dict(rec)


def end_time() -> int:
    return (int(time.time()) - 3600) // STEP * STEP


def test_a_workload_resuming_after_20_days_gets_no_recommendation_from_one_sample(cli: Runner, tmp_path: Path) -> None:
    end = end_time()
    rec = recommend(cli, tmp_path, resumed(end), end + 1)
    # Before: fresh, built from the one 50 MiB sample (request 58Mi, limit 62Mi: OOM-killed at start).
    assert rec["cpu"] is None and rec["memory"] is None
    history = rec["history"]
    assert history["memory_samples"] == 865 and history["memory_recent_samples"] == pytest.approx(1.0, abs=0.01)
    assert history["cpu_recent_samples"] == pytest.approx(1.0, abs=0.01)


def test_a_resumed_workload_is_sized_again_once_it_has_an_hour_of_new_samples(cli: Runner, tmp_path: Path) -> None:
    end = end_time()
    rec = recommend(cli, tmp_path, resumed(end, new_samples=13), end + 1)
    memory = rec["memory"]
    assert memory is not None and not memory["stale"]
    assert rec["history"]["memory_recent_samples"] >= 12
    # The old peak lies outside the 14-day window: the limit covers what the window holds, and the request.
    assert memory["limit"] >= max(memory["limit_floor"], memory["target"]) >= 50 * MIB


def test_the_memory_limit_covers_a_peak_10_days_back(cli: Runner, tmp_path: Path) -> None:
    end = end_time()
    memory = recommend(cli, tmp_path, old_peak(end), end + 1)["memory"]
    # Before: the floor covered 7 days of a 14-day window and the limit was cut to 4097Mi.
    assert memory["limit_floor"] == pytest.approx(8 * GIB * 1.15)
    assert memory["limit"] >= memory["limit_floor"] and memory["limit"] >= memory["target"]


@pytest.fixture(scope="module")
def client(tmp_path_factory: pytest.TempPathFactory) -> Iterator[httpx.Client]:
    workdir = tmp_path_factory.mktemp("resume")
    end = end_time()
    train(pd.concat([resumed(end), old_peak(end)], ignore_index=True), workdir, workdir / "store")
    env = {"KOORD_RECOMMENDER_WEBHOOK__DEFAULT_MODE": "Initial", "KOORD_RECOMMENDER_WEBHOOK__WATCH_API": "off"}
    with tls_client(workdir, env, timeout=30) as found:
        yield found


def mutated(client: httpx.Client, workload: str, resources: dict[str, Any]) -> dict[str, Any]:
    pod = k8s.pod("deployment", workload, [k8s.container("main", resources)])
    answer = client.post("/mutate", json=k8s.review(pod, "ns"))
    assert answer.status_code == 200
    assert answer.json()["response"]["allowed"] is True
    patched: dict[str, Any] = k8s.apply_response(pod, answer.json())["spec"]["containers"][0]["resources"]
    return patched


def test_mutate_leaves_a_resumed_workload_as_it_is(client: httpx.Client) -> None:
    resources = {"requests": {"cpu": "500m", "memory": "1280Mi"}, "limits": {"cpu": "1", "memory": "1372Mi"}}
    # Before: patched to request 58Mi, limit 62Mi.
    assert mutated(client, "resumed", resources) == resources


def test_mutate_keeps_the_memory_limit_above_a_peak_10_days_back(client: httpx.Client) -> None:
    resources = {"requests": {"cpu": "500m", "memory": "1Gi"}, "limits": {"cpu": "1", "memory": "4Gi"}}
    patched = mutated(client, "old-peak", resources)
    limit = memory_bytes_from_quantity(patched["limits"]["memory"])
    # Before: 4097Mi, half the peak.
    assert limit >= 8 * GIB * 1.15
    assert limit >= memory_bytes_from_quantity(patched["requests"]["memory"])
