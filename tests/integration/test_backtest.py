"""A small backtest end to end: the protocol on synthetic data, and the `backtest` command with its report."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from cli.settings import Settings
from pipelines.backtest import METHODS, run_backtest
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
    _, result = run_backtest(small_usage, Settings())
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
    shares = [result.scores[p]["cpu"]["ours"].lines["short_term"].samples for p in ("validation", "held_out")]
    assert sum(shares) == scores["cpu"]["ours"].lines["short_term"].samples and all(shares)
    assert np.all(result.decisions["cpu"].choices["short_term"] >= 0)


def test_backtest_command_writes_table_and_charts(cli: Runner, tmp_path: Path, small_usage: Path) -> None:
    result = cli("backtest", "--input", str(small_usage), "--report", "report")
    assert result.returncode == 0, result.stderr
    assert "| cpu | short-term | ours |" in result.stdout
    report = (tmp_path / "report" / "report.md").read_text()
    assert "Held-out days" in report and "koordinator_mid" in report and "## Model choices" in report
    for chart in ("tradeoff.png", "examples.png"):
        assert (tmp_path / "report" / chart).read_bytes()[:4] == b"\x89PNG"


def test_backtest_rejects_a_missing_file(cli: Runner) -> None:
    result = cli("backtest", "--input", "nope.csv")
    assert result.returncode == 2 and "nope.csv" in result.stderr
