"""A small backtest end to end: the protocol on synthetic data, and the `backtest` command with its report."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from cli.settings import Settings
from pipelines.backtest import LIVE_METHODS, METHODS, STAGES, run_backtest
from pipelines.node_backtest import FAIR_PAIRS, NODE_STAGES, run_node_backtest
from tests.conftest import Runner, make_usage

pytestmark = pytest.mark.integration
DAY = 86400


@pytest.fixture(scope="module")
def small_usage(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Three workloads (two pods each) over 10 days starting at midnight UTC: three decision days."""
    path = tmp_path_factory.mktemp("backtest") / "usage.csv.gz"
    make_usage(workloads=3, pods=2, days=10, start=1_699_920_000, seed=4).to_csv(path, index=False)
    return path


def test_protocol_on_a_small_fleet(small_usage: Path) -> None:
    stages: list[str] = []

    def step(description: str, /, *, detail: bool = False) -> None:
        stages.extend([] if detail else [description])

    # The fleet chooses (below `selection_min_containers` every line would be the flat reference, issue 39).
    settings = Settings(forecast={"selection_min_containers": 1})
    fleet, result = run_backtest(small_usage, settings, step=step)
    # The command's progress counts these stages ("[n/11]"), the baselines' decisions being details within one.
    assert len(stages) == STAGES, stages
    assert result.decision_days == [7, 8, 9]
    scores = result.scores["all"]
    assert set(scores) == {"cpu", "memory"}
    for resource in scores.values():
        assert set(resource) == set(METHODS)
        oracle = resource["oracle"]
        assert oracle.lines["request"].violation == 0.0 and oracle.peak.median_absolute_percentage_error == 0.0
        ours = resource["ours"].lines["short_term"]
        assert ours.samples == 3 * 2 * 3 * 288  # days x workloads x pods x steps
        assert ours.violation < 0.05
        # A daily cycle with little noise: the seasonal line beats every flat baseline at a matched 1 %.
        flat_best = min(
            resource[m].lines["short_term"].matched[0].overprovision for m in ("vpa", "krr_simple", "koordinator_mid")
        )
        assert ours.matched[0].overprovision < flat_best
        # Day-to-day movement of the constant lines: a share for every method; KRR's 14-day p95 of a steady
        # cycle does not move by 1.5x from one day to the next.
        for method in METHODS:
            assert set(resource[method].churn) == {"request", "long_term"}
            assert all(0.0 <= value <= 1.0 for value in resource[method].churn.values())
        assert resource["krr_simple"].churn["request"] == 0.0
    shares = [result.scores[p]["cpu"]["ours"].lines["short_term"].samples for p in ("validation", "held_out")]
    assert sum(shares) == scores["cpu"]["ours"].lines["short_term"].samples and all(shares)
    assert np.all(result.decisions["cpu"].choices["short_term"] >= 0)

    # The live cadence: every line scored on the day-ahead lines' samples; ours issued as it is served.
    for part, resources in result.live.items():
        for resource, methods in resources.items():
            assert list(methods) == list(LIVE_METHODS)
            day_ahead = result.scores[part][resource]["ours"].lines["short_term"]
            assert methods["ours_day_ahead"] == day_ahead
            assert all(s.samples == day_ahead.samples for s in methods.values())
            assert methods["ours_live"].violation < 0.05
    live = result.decisions["cpu"].live
    start = 7 * 288
    grid = fleet.group_grid["cpu"]
    # The first hour's rolling line is the max of the hour before it, held for the hour; the next hour moves on.
    np.testing.assert_array_equal(
        live["max_1h"][0][:, :12], np.repeat(grid[:, start - 12 : start].max(axis=1)[:, None], 12, 1)
    )
    np.testing.assert_array_equal(live["max_6h"][0][:, 12], grid[:, start - 60 : start + 12].max(axis=1))
    assert np.all(np.isfinite(live["ours_live"])) and np.all(live["ours_live"] > 0)


def test_backtest_command_writes_table_and_charts(cli: Runner, tmp_path: Path, small_usage: Path) -> None:
    result = cli("backtest", "--input", str(small_usage), "--report", "report")
    assert result.returncode == 0, result.stderr
    assert "| cpu | short-term | ours |" in result.stdout
    report = (tmp_path / "report" / "report.md").read_text()
    assert "Held-out days" in report and "koordinator_mid" in report and "## Model choices" in report
    assert "## Day-to-day movement" in report and "| cpu | long-term | ours |" in report
    assert "## The live cadence" in report and "| memory | ours_live |" in report
    assert "| cpu | ours_live |" in result.stdout
    for chart in ("tradeoff.png", "examples.png"):
        assert (tmp_path / "report" / chart).read_bytes()[:4] == b"\x89PNG"


def test_backtest_rejects_a_missing_file(cli: Runner) -> None:
    result = cli("backtest", "--input", "nope.csv")
    assert result.returncode == 2 and "nope.csv" in result.stderr


def test_node_backtest_on_a_small_fleet(small_usage: Path) -> None:
    """Koordinator's rules as its source has them, the live path, and the fair comparison, on packed nodes."""
    stages: list[str] = []

    def step(description: str, /, *, detail: bool = False) -> None:
        stages.extend([] if detail else [description])

    result = run_node_backtest(small_usage, Settings(), {"cpu": 8.0, "memory": 16e9}, seed=1, step=step)
    assert len(stages) == NODE_STAGES, stages  # what the command's progress counts
    assert result.decision_days == [7, 8, 9] and len(result.placement.names) >= 2
    for resource in ("cpu", "memory"):
        found = result.summaries["all"]["complete"][resource]
        assert ("koordinator_request" in found) == (resource == "memory")  # Koordinator's CPU has no request policy
        offers = result.offered["complete"][resource]
        for method in ("ours_live", "ours_live_line", "koordinator_mid", "koordinator_our_ratio"):
            values = offers.batch[method]
            assert np.all(np.isfinite(values)) and np.all(values >= 0)
            assert np.all(values <= offers.allocatable[:, None] + 1e-9)
        # a daily cycle the pods repeat: Koordinator's mid reclaims some of their unused requests
        assert found["koordinator_mid"].reclaimed > 0
        # Koordinator's mid never offers more than what the node's last usage leaves
        last = np.concatenate([offers.hp[:, :1], offers.hp[:, :-1]], axis=1)
        assert np.all(offers.batch["koordinator_mid"] <= offers.allocatable[:, None] - last + 1e-6)
        assert set(result.fair[resource]) == set(FAIR_PAIRS)
        assert {m for m, _ in result.sweeps[resource].items()} == {
            "ours_forecast_only",
            "koordinator_our_ratio",
            "ours_live",
            "ours_live_weekly_max",
        }
        # the equal-violation comparison: ours as served and at each budget, per part, both live methods
        assert set(result.equal[resource]) == {"ours_live_line", "ours_live"}
        for part in ("validation", "held_out"):
            compared = result.equal[resource]["ours_live_line"][part]
            assert set(compared.at) == {"ours", "0.1 %", "1 %"} and compared.node_steps > 0
            assert (
                compared.at["ours"].ours is not None
                and compared.at["ours"].ours[1].violations == compared.at["ours"].budget
            )
        assert len(result.koordinator_sweeps[resource]) == 100
        # during outages the mid held from the last report drops to 0 once it is older than 15 minutes
        assert result.summaries["all"]["outages"][resource]["koordinator_mid"].zero_drops >= 1


def test_backtest_nodes_command_writes_the_report(cli: Runner, tmp_path: Path, small_usage: Path) -> None:
    result = cli(
        "backtest",
        "--nodes",
        "--input",
        str(small_usage),
        "--report",
        "nodes",
        "--node-cpu",
        "8",
        "--node-memory",
        "16G",
    )
    assert result.returncode == 0, result.stderr
    report = (tmp_path / "nodes" / "report.md").read_text()
    assert "## Fair comparison, cpu" in report and "| ours_live |" in report
    assert "## Room at equal violations, memory" in report and "## Node live line sweep, cpu" in report
    assert "room against Koordinator's usage policy at equal violations" in result.stdout
    cpu_table = report.split("## all days, complete metrics, cpu")[1].split("##")[0]
    assert "koordinator_request" not in cpu_table and "koordinator_maxUsageRequest" in cpu_table
    for chart in ("nodes-over-time.png", "nodes-outages.png", "node-lines.png"):
        assert (tmp_path / "nodes" / chart).read_bytes()[:4] == b"\x89PNG"
