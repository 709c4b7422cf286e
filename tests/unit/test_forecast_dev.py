"""The churn figure of `scripts/forecast_dev.py`: its decisions laid out as `line_churn` reads them."""

from __future__ import annotations

import importlib.util
import pathlib

import numpy as np

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
