"""The churn figure of `scripts/forecast_dev.py`: its decisions laid out as `line_churn` reads them."""

from __future__ import annotations

import importlib.util
import pathlib

import numpy as np
import pandas as pd

from models.metrics import line_churn

SCRIPT = pathlib.Path(__file__).resolve().parents[2] / "scripts" / "forecast_dev.py"
_spec = importlib.util.spec_from_file_location("forecast_dev", SCRIPT)
assert _spec is not None and _spec.loader is not None
forecast_dev = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(forecast_dev)

DAY = 86400


def test_decisions_by_container_keeps_each_containers_decisions_in_their_rows() -> None:
    lines = {
        ("cpu", ("ns", "a", "main")): {0: (1.0, 4.0), DAY: (2.0, 4.0), 2 * DAY: (1.0, 2.0)},
        # Not decided on the second day (no history yet, or gone): its first and third decisions are no pair.
        ("cpu", ("ns", "b", "main")): {0: (1.0, 1.0), 2 * DAY: (5.0, 5.0)},
        ("memory", ("ns", "a", "main")): {0: (1.0, 1.0), DAY: (9.0, 9.0)},
    }
    request = forecast_dev.decisions_by_container(lines, "cpu", 0)
    np.testing.assert_array_equal(request, [[1.0, 1.0], [2.0, np.nan], [1.0, 5.0]])
    assert line_churn(request, ~np.isnan(request)) == 1.0  # 2x, then 0.5x: both pairs beyond 1.5x
    long_term = forecast_dev.decisions_by_container(lines, "cpu", 1)
    assert line_churn(long_term, ~np.isnan(long_term)) == 0.5  # 1x, then 0.5x
    assert forecast_dev.decisions_by_container(lines, "gpu", 0).shape == (0, 0)


def test_asked_at_reads_the_last_row_before_the_decision_and_nan_without_one() -> None:
    rows = pd.DataFrame(
        {
            "timestamp": [300, 100, 200, 100],
            "namespace": ["ns", "ns", "ns", "ns"],
            "workload": ["a", "a", "a", "b"],
            "container": ["main"] * 4,
            "cpu_limit_cores": [3.0, 1.0, 2.0, 8.0],
            "memory_request_bytes": [30.0, 10.0, 20.0, np.nan],
        }
    )
    asked = forecast_dev.current_requests(rows)
    # Rows sorted by time: at 250 the row of 200 holds; the file has no CPU request column (NaN), no memory limit.
    assert np.isnan(forecast_dev.asked_at(asked["cpu"], ("ns", "a", "main"), 250)[0])
    assert forecast_dev.asked_at(asked["cpu"], ("ns", "a", "main"), 250)[1] == 2.0
    assert forecast_dev.asked_at(asked["memory"], ("ns", "a", "main"), 301)[0] == 30.0
    assert np.isnan(forecast_dev.asked_at(asked["memory"], ("ns", "a", "main"), 301)[1])
    # Nothing before the decision (the row at 100 is not before 100), or an unknown container: NaN for both.
    assert all(np.isnan(forecast_dev.asked_at(asked["cpu"], ("ns", "b", "main"), 100)))
    assert all(np.isnan(forecast_dev.asked_at(asked["cpu"], ("ns", "z", "main"), 1000)))


class _Window:
    """The two things `has_evidence` reads of a harness `Series`."""

    def __init__(self, ts: list[float], cpu: list[float]) -> None:
        self.ts, self.cpu = np.asarray(ts, dtype=np.int64), np.asarray(cpu, dtype=np.float64)

    def values(self, resource: str) -> np.ndarray:
        return self.cpu


def test_has_evidence_counts_samples_by_weight_before_the_newest_as_recommend_does() -> None:
    hour = [300 * i for i in range(12)]
    windows = [
        _Window(hour, [1.0] * 12),  # an hour of fresh samples: 11.9, counts as 12
        _Window(hour[:11], [1.0] * 11),  # one short
        _Window([0, *(3 * DAY + t for t in hour)], [1.0] * 13),  # a gap, then an hour: enough
        _Window([0], [1.0]),  # one sample, long ago (a stale container): never enough
        _Window(hour, [np.nan] * 12),  # no known sample
        # An old day and one new sample: the old ones weigh 2^-20 each, far from 12.
        _Window([*(t for t in range(0, DAY, 300)), 21 * DAY], [1.0] * 289),
    ]
    assert forecast_dev.has_evidence(windows, "cpu").tolist() == [True, False, True, False, False, False]
