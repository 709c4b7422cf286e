"""Which usage rows the node model learns from: pods placed on a node, not of a borrowing priority class. Apart from
the estimators (pandas only, no scikit-learn), so a read can check placement before the models are imported."""

from __future__ import annotations

import numpy as np
import numpy.typing as npt
import pandas as pd

from recommender import koordinator


def high_priority_mask(usage: pd.DataFrame) -> npt.NDArray[np.bool_]:
    """Per row: placed on a node and not of a borrowing priority class."""
    node = usage["node"]
    placed = node.notna().to_numpy() & (node != "").to_numpy()
    if "priority_class" in usage.columns:
        placed &= ~usage["priority_class"].isin(koordinator.BORROWING_CLASSES).to_numpy()
    return placed


def high_priority_rows(usage: pd.DataFrame) -> pd.DataFrame:
    """Rows placed on a node and not of a borrowing priority class."""
    return usage[high_priority_mask(usage)]


def last_node_sample(usage: pd.DataFrame) -> int | None:
    """The newest sample of a high-priority pod on a node (what the node model learns from), None when the usage
    says of none where it ran: the one placement check of training (read off the rows, none copied)."""
    if "node" not in usage.columns:
        return None
    placed = high_priority_mask(usage)
    return int(usage["timestamp"].to_numpy()[placed].max()) if placed.any() else None
