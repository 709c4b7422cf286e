"""The churn figure of `scripts/forecast_dev.py` (how much a line moves from one decision to the next)."""

from __future__ import annotations

import importlib.util
import pathlib

import numpy as np

SCRIPT = pathlib.Path(__file__).resolve().parents[2] / "scripts" / "forecast_dev.py"
_spec = importlib.util.spec_from_file_location("forecast_dev", SCRIPT)
assert _spec is not None and _spec.loader is not None
forecast_dev = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(forecast_dev)

DAY = 86400


def test_day_over_day_pairs_each_containers_consecutive_decisions_only() -> None:
    lines = {
        ("cpu", ("ns", "a", "main")): {0: (1.0, 4.0), DAY: (2.0, 4.0), 2 * DAY: (1.0, 2.0)},
        # A gap of two days is not a day-over-day change; a zero line has no ratio.
        ("cpu", ("ns", "b", "main")): {0: (1.0, 1.0), 3 * DAY: (5.0, 5.0), 4 * DAY: (0.0, 5.0)},
        ("memory", ("ns", "a", "main")): {0: (1.0, 1.0), DAY: (9.0, 9.0)},
    }
    np.testing.assert_allclose(np.sort(forecast_dev.day_over_day(lines, "cpu", 0, DAY)), [0.5, 2.0])
    np.testing.assert_allclose(np.sort(forecast_dev.day_over_day(lines, "cpu", 1, DAY)), [0.5, 1.0, 1.0])
    np.testing.assert_allclose(forecast_dev.day_over_day(lines, "cpu", 0, 3 * DAY), [5.0])
    assert forecast_dev.day_over_day(lines, "gpu", 0, DAY).size == 0
