"""Which usage rows the node model learns from: pods placed on a node, not of a borrowing priority class. Apart from
the estimators (pandas only, no scikit-learn), so a read can check placement before the models are imported."""

from __future__ import annotations

import pandas as pd

from recommender import koordinator


def high_priority_rows(usage: pd.DataFrame) -> pd.DataFrame:
    """Rows placed on a node and not of a borrowing priority class."""
    placed = usage["node"].notna() & (usage["node"].astype(str) != "")
    if "priority_class" in usage.columns:
        placed &= ~usage["priority_class"].isin(koordinator.BORROWING_CLASSES)
    return usage[placed]


def last_node_sample(usage: pd.DataFrame) -> int | None:
    """The newest sample of a high-priority pod on a node (what the node model learns from), None when the usage
    says of none where it ran: the one placement check of training."""
    if "node" not in usage.columns:
        return None
    placed = high_priority_rows(usage)
    return None if placed.empty else int(placed["timestamp"].max())
