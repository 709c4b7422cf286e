"""Input checks shared by the estimators: one place that says what a usage frame must hold."""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np
import pandas as pd


def require_columns(frame: pd.DataFrame, columns: Iterable[str], estimator: str) -> None:
    """Raise a ValueError naming the estimator and the missing columns."""
    if not isinstance(frame, pd.DataFrame):
        raise TypeError(f"{estimator} expects a pandas DataFrame, got {type(frame).__name__}")
    missing = [c for c in columns if c not in frame.columns]
    if missing:
        raise ValueError(f"{estimator} needs columns {missing}; got {list(frame.columns)}")


def factorize_groups(groups: pd.Series) -> tuple[np.ndarray, pd.Index]:
    """Integer codes and string labels of a group column; cheap when it is already categorical."""
    if isinstance(groups.dtype, pd.CategoricalDtype):
        return groups.cat.codes.to_numpy(dtype=np.int64), pd.Index(groups.cat.categories.astype(str))
    codes, uniques = pd.factorize(groups)
    return codes.astype(np.int64), pd.Index(pd.Index(uniques).astype(str))
