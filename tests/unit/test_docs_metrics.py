"""The metrics reference (docs/metrics.md) names every metric the code registers, so it cannot fall behind."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
#: Where metrics are registered: the service's registry and the live loop's.
SOURCES = [ROOT / "serving" / "metrics.py", ROOT / "pipelines" / "live.py"]


def registered() -> set[str]:
    """Every metric name written as a string literal where metrics are registered."""
    return {name for path in SOURCES for name in re.findall(r'"(koord_recommender_[a-z_]+)"', path.read_text())}


def test_every_registered_metric_is_documented() -> None:
    names = registered()
    assert len(names) >= 20, names  # the scan still finds the registrations
    page = (ROOT / "docs" / "metrics.md").read_text()
    missing = sorted(name for name in names if f"`{name}`" not in page)
    assert not missing, f"docs/metrics.md lacks {missing}"
