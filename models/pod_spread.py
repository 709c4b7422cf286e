"""How far a workload's pods sit below each step's busiest pod, so that a line learned on the busiest one holds for
every pod at its asked risk.

The day-ahead lines are learned on a grid of each 5-minute step's maximum over a workload's pods: one series a
container, whatever its replicas. A request holds for every pod, and it is judged (as VPA's histograms count) on
each pod's own samples. Calibrated on the maxima, a line for P = 1 % left 0.14 % of a seven-pod job's samples
above it. `PodSpread` keeps, per workload container that ran several pods at once, two decaying histograms: one of
each pod's samples and one of each step's busiest pod; the (1 - P) quantile of the first over that of the second
is the factor that brings a line of the busiest pod's level to the pods' own (exactly, for a flat quantile line).
A container that ran one pod at a time has the same two histograms, so its factor is 1; one that never ran two is
not kept at all.
"""

from __future__ import annotations

from typing import Any, Self

import numpy as np
import pandas as pd
from sklearn.base import BaseEstimator
from sklearn.utils.validation import check_is_fitted

from models._validation import factorize_groups, require_columns
from models.histogram import DecayingHistogram
from models.pods import pod_pairs
from recommender.arrays import FloatArray, IntArray


class PodSpread(BaseEstimator):  # type: ignore[misc]
    """Per workload container of several pods, the ratio of its pods' (1 - P) quantile to its busiest pod's.

    Parameters: `half_life_seconds` of both histograms (their weights, so the ratio is of the same days),
    `step_seconds` the grid's step (a pod's samples within one step count as their max, as the grid takes them),
    and the histograms' buckets (`first_bucket_size`, `max_value`, `epsilon` in the resource's unit, as its VPA
    histogram's; `bucket_growth_ratio` 1 %, finer than VPA's 5 %: a ratio of two bucket edges moves in steps of it,
    and a 5 % step cut a steady line by 5 % where its pods differed by 1 %). Fitted on (group, pod, timestamp,
    value) samples: `pods_` and `busiest_` (`DecayingHistogram`s of the groups that ran two pods in one step, in the
    order they were first seen) and `groups_` (their labels).
    """

    def __init__(
        self,
        half_life_seconds: float = 7 * 86400.0,
        step_seconds: int = 300,
        first_bucket_size: float = 0.01,
        max_value: float = 1000.0,
        bucket_growth_ratio: float = 0.01,
        epsilon: float = 1e-4,
    ) -> None:
        self.half_life_seconds = half_life_seconds
        self.step_seconds = step_seconds
        self.first_bucket_size = first_bucket_size
        self.max_value = max_value
        self.bucket_growth_ratio = bucket_growth_ratio
        self.epsilon = epsilon

    def _histogram(self) -> DecayingHistogram:
        return DecayingHistogram(
            first_bucket_size=self.first_bucket_size,
            max_value=self.max_value,
            bucket_growth_ratio=self.bucket_growth_ratio,
            half_life_seconds=self.half_life_seconds,
            sample_weight=1.0,
            epsilon=self.epsilon,
        )

    def fit(self, X: pd.DataFrame, y: Any = None) -> Self:
        self.pods_, self.busiest_ = self._histogram(), self._histogram()
        self.groups_ = np.zeros(0, dtype=str)
        return self._add(X)

    def partial_fit(self, X: pd.DataFrame, y: Any = None) -> Self:
        """Continue with newer samples (the decay is exact, as the histograms' is); a group starts being kept at the
        first batch in which it ran two pods in one step."""
        if not hasattr(self, "pods_"):
            return self.fit(X)
        return self._add(X)

    def _add(self, X: pd.DataFrame) -> Self:
        require_columns(X, ("group", "pod", "timestamp", "value"), type(self).__name__)
        values = X["value"].to_numpy(dtype=np.float64)
        known = np.isfinite(values) & (values >= 0)
        groups, labels = factorize_groups(X["group"])
        pods = pd.factorize(X["pod"])[0].astype(np.int64)
        steps = (X["timestamp"].to_numpy(dtype=np.float64) // self.step_seconds).astype(np.int64)
        groups, pods, steps, values = groups[known], pods[known], steps[known], values[known]
        pairs, owners = pod_pairs(groups, pods)
        # Only groups kept already or with two pods in this batch are read further (a fleet of one pod a container,
        # as Bitbrains' VMs are, costs a factorisation).
        kept = (
            np.isin(np.asarray(labels, dtype=str), self.groups_) if self.groups_.size else np.zeros(len(labels), bool)
        )
        candidate = kept | (np.bincount(owners, minlength=len(labels)) > 1)
        if not candidate.any():
            return self
        rows = candidate[groups]
        # Each pod's max in each step, then each group's max over its pods in that step (the grid's cell).
        per_pod = (
            pd.DataFrame({"pair": pairs[rows], "step": steps[rows], "value": values[rows]})
            .groupby(["pair", "step"])
            .max()
        )
        pod_group = owners[per_pod.index.get_level_values("pair").to_numpy()]
        pod_steps = per_pod.index.get_level_values("step").to_numpy()
        pod_values = per_pod["value"].to_numpy()
        cells = (
            pd.DataFrame({"group": pod_group, "step": pod_steps, "value": pod_values})
            .groupby(["group", "step"])["value"]
            .agg(["max", "size"])
        )
        cell_group = cells.index.get_level_values("group").to_numpy()
        cell_steps = cells.index.get_level_values("step").to_numpy()
        tracked = kept.copy()
        tracked[cell_group[cells["size"].to_numpy() > 1]] = True
        if not tracked.any():
            return self
        keep_pods, keep_cells = tracked[pod_group], tracked[cell_group]
        local = pd.Index(np.asarray(labels, dtype=str)[tracked])
        code_of = np.cumsum(tracked) - 1  # a tracked group's code among `local`
        seconds = float(self.step_seconds)
        self.pods_.add_samples(
            code_of[pod_group[keep_pods]], local, pod_steps[keep_pods] * seconds, pod_values[keep_pods]
        )
        self.busiest_.add_samples(
            code_of[cell_group[keep_cells]],
            local,
            cell_steps[keep_cells] * seconds,
            cells["max"].to_numpy()[keep_cells],
        )
        self.groups_ = self.pods_.groups_
        return self

    def ratios(self, violation: float, groups: pd.Index) -> FloatArray:
        """Per label of `groups`, the factor (at most 1) that brings a line at the busiest pod's level to P =
        `violation` of the pods' own samples; 1 where the group is not kept or its busiest pod's quantile is 0."""
        check_is_fitted(self, "pods_")
        out = np.ones(len(groups))
        if not self.groups_.size:
            return out
        q = 1.0 - violation
        pods, busiest = self.pods_.quantile(q), self.busiest_.quantile(q)
        # Both histograms hold the same groups, first seen in the same batch: one order.
        with np.errstate(divide="ignore", invalid="ignore"):
            ratio: FloatArray = np.where(busiest > 0, np.minimum(pods / busiest, 1.0), 1.0)
        where: IntArray = pd.Index(self.groups_).get_indexer(pd.Index(np.asarray(groups, dtype=str)))
        out[where >= 0] = ratio[where[where >= 0]]
        return out
