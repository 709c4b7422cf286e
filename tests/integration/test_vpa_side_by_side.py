"""The `vpa` policy on real data against VPA's rules recomputed plainly here, equal to the millicore and the byte.

The recomputation reads the rules as VPA's recommender applies them to a stream of 1-minute samples: CPU samples
as whole millicores weighing 0.1 x 2^((t - reference) / 24 h), one memory peak per pod and 24 h window (anchored at
the pod's first sample, dated at the window's end; 0 for a window whose first sample is 0) weighing 1, the percentile
at the end of the bucket where the
weight reaches p x total, + 15 %, x (1 + 0.001/days)^-2 and x (1 + 1/days), the pod minimum split over the
containers, each step truncated to whole units. No histogram class, no state machine: sums and loops.
"""

from __future__ import annotations

import math
from collections import defaultdict

import pandas as pd
import pytest

from models.pods import with_group_labels
from models.workload import WorkloadRecommender
from tests.conftest import BUNDLED, SHARED_BITBRAINS

DAY = 86400.0
ZERO_TIME = 62135596800  # Go's zero time before the Unix epoch: where time.Round counts from


def bucket(value: float, first: float) -> int:
    if value < first:
        return 0
    return min(int(math.log(value * 0.05 / first + 1) / math.log(1.05)), 175)


def bucket_end(index: int, first: float) -> float:
    index = min(index + 1, 175)
    return first * (1.05**index - 1) / 0.05


def percentile(weights: dict[int, float], p: float, first: float) -> float:
    kept = sorted(b for b, w in weights.items() if w >= 1e-4)
    if not kept:
        return 0.0
    total, running = sum(weights.values()), 0.0
    for b in range(kept[0], kept[-1]):
        running += weights.get(b, 0.0)
        if running >= p * total:
            return bucket_end(b, first)
    return bucket_end(kept[-1], first)


def reference_of(times: list[float]) -> float:
    """VPA's reference after these sample times: the first rounded to the half-life, moved to a sample's (rounded)
    time when it comes more than 100 half-lives later."""
    reference = round_day(times[0])
    for t in times:
        if t > reference + 100 * DAY:
            reference = round_day(t)
    return reference


def round_day(t: float) -> float:
    return math.floor((t + ZERO_TIME) / DAY + 0.5) * DAY - ZERO_TIME


def truncate(x: float) -> int:
    return 0 if x < 0 else min(int(x), 10**14)


Bounds = tuple[int, int, int]


def plain_vpa(
    usage: pd.DataFrame, containers_per_pod: dict[str, int], as_of: float
) -> dict[str, tuple[Bounds, Bounds] | None]:
    """Per group label, (CPU millicores, memory bytes) as (target, lower, upper); None once VPA has forgotten the
    group (its last CPU sample 8 days or more before `as_of`)."""
    out: dict[str, tuple[Bounds, Bounds] | None] = {}
    for group, rows in usage.groupby("group", observed=True):
        cpu: list[tuple[float, int]] = []
        peaks: list[tuple[float, int]] = []
        for _, pod in rows.sort_values("timestamp", kind="stable").groupby("pod"):
            seen: set[float] = set()
            windows: dict[int, int] = {}
            first_memory = None
            for t, cores, memory in zip(pod["timestamp"], pod["cpu_cores"], pod["memory_bytes"]):
                if cores == cores and t not in seen:
                    seen.add(t)
                    cpu.append((float(t), truncate(cores * 1000)))
                if memory == memory:
                    first_memory = t if first_memory is None else first_memory
                    window = int((t - first_memory) // DAY)
                    # A window opened by a 0 keeps 0: VPA replaces a peak only once it is non-zero.
                    opened = window not in windows
                    if opened or windows[window] != 0:
                        windows[window] = max(windows.get(window, 0), truncate(memory))
            peaks += [(first_memory + (w + 1) * DAY, peak) for w, peak in windows.items()]
        times = sorted(t for t, _ in cpu)
        if as_of - times[-1] >= 8 * DAY:
            out[str(group)] = None
            continue
        cpu_weights: dict[int, float] = defaultdict(float)
        reference = reference_of(times)
        for t, millicores in sorted(cpu):
            cpu_weights[bucket(millicores / 1000, 0.01)] += 0.1 * 2 ** ((t - reference) / DAY)
        memory_weights: dict[int, float] = defaultdict(float)
        reference = reference_of(sorted(t for t, _ in peaks))
        for t, value in sorted(peaks):
            memory_weights[bucket(value, 1e7)] += 2 ** ((t - reference) / DAY)
        days = min((times[-1] - times[0]) / DAY, len(times) / 1440)
        n = containers_per_pod[str(group)]
        cpu_min, memory_min = truncate(25 / n), truncate(262144000 / n)
        both = []
        for weights, first, to_units, minimum in (
            (cpu_weights, 0.01, 1000.0, cpu_min),
            (memory_weights, 1e7, 1.0, memory_min),
        ):

            def estimate(p: float) -> int:
                base = truncate(percentile(weights, p, first) * to_units)
                return base + truncate(base * 0.15)

            lower = truncate(estimate(0.5) * (1 + 0.001 / days) ** -2)
            upper = truncate(estimate(0.95) * (1 + 1 / days))
            both.append((max(estimate(0.9), minimum), max(lower, minimum), max(upper, minimum)))
        out[str(group)] = (both[0], both[1])
    return out


def frames() -> list[tuple[str, pd.DataFrame]]:
    found = [("google-2019", pd.read_csv(BUNDLED))]
    if SHARED_BITBRAINS.exists():
        bitbrains = pd.read_csv(SHARED_BITBRAINS, engine="pyarrow")
        first = bitbrains["timestamp"].min()
        keep = bitbrains["workload"].isin(sorted(bitbrains["workload"].unique())[:30]) & (
            bitbrains["timestamp"] < first + 10 * DAY
        )
        found.append(("bitbrains-aug, 30 VMs x 10 days", bitbrains[keep].reset_index(drop=True)))
    return found


@pytest.mark.parametrize(("name", "usage"), frames(), ids=lambda x: x if isinstance(x, str) else "")
def test_vpa_policy_equals_vpa_rules_recomputed(name: str, usage: pd.DataFrame) -> None:
    model = WorkloadRecommender(request_policy="vpa", min_samples=1, forecast_enabled=False).fit(usage)
    as_of = int(usage["timestamp"].max()) + 1
    result = model.predict(as_of=as_of)
    labelled = with_group_labels(usage)
    per_pod = model.workloads_["containers_per_pod"].astype(int).to_dict()
    expected = plain_vpa(labelled, per_pod, as_of)
    compared = 0
    for rec, label in zip(result.recommendations, model.workloads_.index):
        if expected[label] is None:  # forgotten by VPA: no recommendation
            assert rec.cpu is None and rec.memory is None
            continue
        cpu, memory = expected[label]  # type: ignore[misc]
        assert rec.cpu is not None and rec.cpu.policy == "vpa"
        got_cpu = tuple(round(v * 1000) for v in (rec.cpu.target, rec.cpu.lower_bound, rec.cpu.upper_bound))
        assert got_cpu == cpu, (name, label)
        if rec.memory is not None:
            got_memory = tuple(int(v) for v in (rec.memory.target, rec.memory.lower_bound, rec.memory.upper_bound))
            assert got_memory == memory, (name, label)
        compared += 1
    assert compared == sum(e is not None for e in expected.values()) > 0
