"""Issue 39 item 1 through the real CLI and server: a steady container with a limit, in a fleet whose calibration
factor lifts its lines, gets no line above max(limit, highest sample); its twin with an OOM kill keeps its lines
above and every surface (recommend's JSON, show's JSON and CSV, the REST API) says why."""

from __future__ import annotations

import csv
import io
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pandas as pd
import pytest

from cli.settings import Settings
from models.pods import group_label
from pipelines.backtest import run_backtest
from recommender.ceiling import ABOVE, CAPPED
from tests.conftest import Runner
from tests.integration.server import serving

pytestmark = pytest.mark.integration
DAY, GIB = 86400, 2.0**30
LIMIT_BYTES = 1.2 * GIB
#: Every line the ceiling holds, read off one resource's recommendation.
LINES = {
    "target": lambda r: r["target"],
    "upper_bound": lambda r: r["upper_bound"],
    "uncapped_target": lambda r: r["uncapped_target"],
    "short_term": lambda r: max(r["short_term"]),
    "long_term": lambda r: r["long_term"],
    "peak": lambda r: r["peak"]["value"],
    "live_short_term": lambda r: (r["live_short_term"] or {}).get("value", 0.0),
}


def fleet(end: int) -> pd.DataFrame:
    """15 days to `end`: `steady` (1 GiB within 1 %, limit 1.2 GiB; 0.5 core, limit 0.6), its twin `steady-oom`
    (the `files` fixture adds an OOM kill), five bursty containers without limits whose rare bursts give the fleet a
    memory factor well above 1 (what lifted the demo's steady job to 14.7-17.6 Gi under a 13 Gi limit), and
    `steady-throttled`, the steady CPU throttled in 20 % of its periods."""
    rng = np.random.default_rng(0)
    times = np.arange(end - 15 * DAY, end, 300)
    frames = []

    def add(
        workload: str, cpu: Any, memory: Any, cpu_limit: float, memory_limit: float, throttled: float = np.nan
    ) -> None:
        frames.append(
            pd.DataFrame(
                {
                    "timestamp": times,
                    "namespace": "ns",
                    "workload": workload,
                    "pod": f"{workload}-0",
                    "container": "main",
                    "cpu_cores": cpu,
                    "memory_bytes": memory,
                    "cpu_limit_cores": cpu_limit,
                    "memory_limit_bytes": memory_limit,
                    "cpu_throttled_fraction": throttled,
                }
            )
        )

    for name in ("steady", "steady-oom"):
        cpu, memory = 0.5 + rng.uniform(0, 0.02, times.size), GIB * (1 + rng.uniform(0, 0.01, times.size))
        add(name, cpu, memory, 0.6, LIMIT_BYTES)
    phase = 2 * np.pi * (times % DAY) / DAY
    for k in range(5):
        bursts = np.where(rng.random(times.size) < 0.02, 1.6, 1.0)
        cpu = (k + 1) * (0.5 + 0.3 * np.sin(phase)) + rng.uniform(0, 0.05, times.size)
        memory = (k + 1) * GIB * (1 + 0.1 * np.sin(phase)) + rng.uniform(0, 1e7, times.size)
        add(f"bursty{k}", cpu * bursts, memory * bursts, np.nan, np.nan)
    # steady CPU under its limit, throttled (its memory bursty like the rest, without a limit)
    add("steady-throttled", 0.5 + rng.uniform(0, 0.02, times.size), memory * bursts, 0.6, np.nan, 0.2)
    return pd.concat(frames).sort_values(["namespace", "workload", "pod", "container", "timestamp"])


@pytest.fixture(scope="module", autouse=True)
def choosing_fleet() -> Iterator[None]:
    """This fleet of 8 chooses and pools its factor as a fleet of 30 or more does (`selection_min_containers`): the
    pooled factor is what lifted the demo's steady job above its limit, and what the ceiling must hold."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("KOORD_RECOMMENDER_FORECAST__SELECTION_MIN_CONTAINERS", "1")
        yield


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, pd.DataFrame, int]:
    directory = tmp_path_factory.mktemp("ceiling")
    end = int(time.time()) // 300 * 300
    usage = fleet(end)
    usage.to_csv(directory / "usage.csv", index=False)
    kill = {"timestamp": end - 2 * DAY, "namespace": "ns", "workload": "steady-oom", "pod": "steady-oom-0"}
    pd.DataFrame([{**kill, "container": "main"}]).to_csv(directory / "oom.csv", index=False)
    return directory / "usage.csv", directory / "oom.csv", usage, end


def by_workload(document: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {r["workload"]: r for r in document["recommendations"]}


def assert_held(rec: dict[str, Any], usage: pd.DataFrame) -> None:
    """No line of either resource above max(current limit, highest sample), and each held line says so."""
    rows = usage[usage["workload"] == rec["workload"]]
    for resource, column, limit in (("cpu", "cpu_cores", 0.6), ("memory", "memory_bytes", LIMIT_BYTES)):
        learned = rec[resource]
        ceiling = max(limit, float(rows[column].max()))
        assert learned["ceiling"] == pytest.approx(ceiling)
        for name, value in LINES.items():
            assert value(learned) <= ceiling * (1 + 1e-12), (resource, name, value(learned), ceiling)
        assert all(rule == CAPPED for rule in learned["ceiling_rules"].values()), learned["ceiling_rules"]


def test_recommend_holds_a_steady_container_under_its_limit(cli: Runner, tmp_path: Path, files: Any) -> None:
    usage_path, _, usage, end = files
    result = cli(
        "recommend", "--input", str(usage_path), "--as-of", str(end), "--horizon", "24h", "--output", "out.json"
    )
    assert result.returncode == 0, result.stderr
    recs = by_workload(json.loads((tmp_path / "out.json").read_text()))
    steady = recs["steady"]
    assert_held(steady, usage)
    # Without the ceiling the fleet's factor put these above both the 1.2 GiB limit and the 1.01 GiB peak.
    assert "upper_bound" in steady["memory"]["ceiling_rules"]
    assert steady["memory"]["upper_bound"] == pytest.approx(LIMIT_BYTES)
    # Throttling is CPU's evidence: the throttled twin's CPU lines may stand above its limit, saying why.
    throttled = recs["steady-throttled"]["cpu"]
    assert throttled["ceiling_rules"] and set(throttled["ceiling_rules"].values()) == {
        ABOVE + "throttled in 20 % of CFS periods"
    }
    assert throttled["upper_bound"] > throttled["ceiling"]


def test_every_surface_says_why_evidence_lifts_a_line(cli: Runner, tmp_path: Path, files: Any) -> None:
    usage_path, oom_path, usage, _ = files
    trained = cli("train", "--input", str(usage_path), "--oom-events", str(oom_path), "--store", "store")
    assert trained.returncode == 0, trained.stderr
    shown = cli("show", "--store", "store", "--format", "json")
    assert shown.returncode == 0, shown.stderr
    recs = by_workload(json.loads(shown.stdout))
    assert_held(recs["steady"], usage)
    # The OOM-killed twin: the same usage, but the kill is evidence, so its lines may stand above, each saying why.
    twin = recs["steady-oom"]["memory"]
    above = {name for name, value in LINES.items() if value(twin) > twin["ceiling"]}
    assert above and set(twin["ceiling_rules"]) == above
    assert all(rule == ABOVE + "1 OOM kill in the history" for rule in twin["ceiling_rules"].values())
    # show's CSV carries the rules per line
    table = {
        row["workload"]: row
        for row in csv.DictReader(io.StringIO(cli("show", "--store", "store", "--format", "csv").stdout))
    }
    assert "memory upper_bound: " + CAPPED in table["steady"]["ceiling_rules"]
    assert "memory upper_bound: " + ABOVE + "1 OOM kill in the history" in table["steady-oom"]["ceiling_rules"]
    # and the REST API serves the same held lines
    with serving(Path("store"), tmp_path) as base:
        served = httpx.get(f"{base}/api/v1/recommendations/ns/steady", timeout=10).json()[0]
    assert served["memory"]["upper_bound"] == recs["steady"]["memory"]["upper_bound"]
    assert served["memory"]["ceiling_rules"] == recs["steady"]["memory"]["ceiling_rules"]


def test_replay_and_backtest_hold_the_same_ceiling(cli: Runner, tmp_path: Path, files: Any) -> None:
    """The live line replayed on the file (`replay`, the live loop's twin) and our lines in `backtest` are held as
    `recommend` holds them: the steady container's memory never above its 1.2 GiB limit (its highest sample is
    lower)."""
    usage_path, _, _, end = files
    start = (end - 2 * DAY) // 3600 * 3600
    result = cli(
        "replay",
        "--input",
        str(usage_path),
        "--start",
        str(start),
        "--end",
        str(start + 6 * 3600),
        "--output",
        "r.parquet",
    )
    assert result.returncode == 0, result.stderr
    lines = pd.read_parquet(tmp_path / "r.parquet")
    steady = lines[(lines["workload"] == "steady") & (lines["resource"] == "memory")]
    assert len(steady) and steady["value"].max() <= LIMIT_BYTES
    fleet, backtest = run_backtest(usage_path, Settings())
    memory = backtest.decisions["memory"]
    row = fleet.groups.get_loc(group_label("ns", "steady", "main"))
    for table in (memory.request, memory.short_term, memory.long_term, memory.peak):
        assert np.nanmax(table["ours"][:, row]) <= LIMIT_BYTES
