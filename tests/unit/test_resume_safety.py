"""Issue 39, items 8-10 as properties: whatever the history (gaps, resumes, old peaks), what `/mutate` applies never
puts a limit (CPU or memory) under the history window's highest usage or under the request, and never a request above its
limit; a container that resumed after a long gap with less than `policy.min_samples` of new data is left alone."""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd
from hypothesis import HealthCheck, given
from hypothesis import settings as hsettings
from hypothesis import strategies as st

from models.histogram import DecayingHistogram
from models.workload import WorkloadRecommender
from recommender.identity import WorkloadKey
from recommender.mutation import mutate
from recommender.optin import OptIn
from recommender.settings import ForecastSettings, WebhookPolicy
from recommender.units import MIB, cpu_cores_from_quantity, cpu_quantity, memory_bytes_from_quantity, memory_quantity
from serving.settings import WebhookSettings
from tests.conftest import DAY, make_usage
from tests.k8s import container, pod

STEP = 300
END = 1_700_000_000 // STEP * STEP
WINDOW_SECONDS = ForecastSettings().history_days * DAY
MIN_SAMPLES = 12

#: A block of samples: (days before END it starts, hours it lasts, MiB it uses).
blocks = st.tuples(st.floats(0.0, 25.0), st.floats(0.1, 72.0), st.floats(10.0, 4000.0))


@st.composite
def histories(draw: st.DrawFn) -> tuple[pd.DataFrame, int]:
    """Blocks of samples with gaps between them, an old peak somewhere, and `resumed` samples at the end after a gap
    of 14-25 days (0: none); (rows, resumed)."""
    parts = [
        (int(END - start * DAY) // STEP * STEP, hours, mib)
        for start, hours, mib in draw(st.lists(blocks, min_size=1, max_size=3))
    ]
    times, memory = [], []
    for start, hours, mib in parts:
        block = np.arange(start, min(start + int(hours * 3600), END) + 1, STEP)
        times.append(block)
        memory.append(np.full(block.size, mib * MIB))
    when, value = np.concatenate(times), np.concatenate(memory)
    peak_at = draw(st.floats(0.0, 20.0))
    peak = np.abs(when - (END - peak_at * DAY))
    value[int(np.argmin(peak))] = draw(st.floats(100.0, 16000.0)) * MIB
    resumed = draw(st.sampled_from([0, 0, 1, 5, 11, 13, 30]))
    if resumed:
        gap_days = draw(st.floats(14.0, 25.0))
        keep = when < END - gap_days * DAY
        new = END + STEP * np.arange(1, resumed + 1)
        when = np.concatenate([when[keep], new])
        value = np.concatenate([value[keep], np.full(resumed, draw(st.floats(10.0, 200.0)) * MIB)])
        if not keep.any():
            resumed = 0  # no old history: a new container, not a resumed one
    when, first = np.unique(when, return_index=True)
    frame = pd.DataFrame(
        {
            "timestamp": when,
            "namespace": "ns",
            "workload": "web",
            "pod": "web-1",
            "container": "main",
            # CPU follows memory's shape (1 core a GiB), so its old peaks and gaps are drawn too.
            "cpu_cores": value[first] / (1024 * MIB),
            "memory_bytes": value[first],
        }
    )
    return frame, resumed


def window_peak(frame: pd.DataFrame, as_of: int, column: str = "memory_bytes") -> float:
    inside = frame[(frame["timestamp"] >= as_of - WINDOW_SECONDS) & (frame["timestamp"] < as_of)]
    return float(inside[column].max()) if len(inside) else 0.0


@hsettings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    history=histories(),
    request_mib=st.floats(16.0, 8192.0),
    limit_ratio=st.floats(1.0, 4.0),
    cpu_request_millicores=st.integers(0, 4000),
    controlled=st.sampled_from(["RequestsAndLimits", "RequestsOnly"]),
)
def test_applied_limits_cover_the_window_peak_and_the_request(
    history: tuple[pd.DataFrame, int],
    request_mib: float,
    limit_ratio: float,
    cpu_request_millicores: int,
    controlled: str,
) -> None:
    frame, resumed = history
    as_of = int(frame["timestamp"].max()) + 1
    rec = WorkloadRecommender().fit(frame).predict(as_of=as_of).recommendations[0]
    resources: dict[str, Any] = {
        "requests": {"cpu": cpu_quantity(cpu_request_millicores / 1000), "memory": memory_quantity(request_mib * MIB)},
        # Item 10's shape where the request is 0: a limit off the millicore grid.
        "limits": {
            "cpu": cpu_quantity(cpu_request_millicores * limit_ratio / 1000) if cpu_request_millicores else "1500u",
            "memory": memory_quantity(request_mib * limit_ratio * MIB),
        },
    }
    original = pod("deployment", "web", [container("main", resources)])
    webhook = WebhookSettings(policies=[WebhookPolicy(controlled_values=controlled)])
    lookup = {WorkloadKey("ns", "web", "main"): rec}.get
    found = mutate(original, "ns", lookup, webhook, "v1", OptIn("Initial", "test")).pod["spec"]["containers"][0]
    after = found["resources"]
    for name, parse, column in (
        ("cpu", cpu_cores_from_quantity, "cpu_cores"),
        ("memory", memory_bytes_from_quantity, "memory_bytes"),
    ):
        assert parse(after["requests"][name]) <= parse(after["limits"][name]), (name, after)
        if after["limits"][name] != resources["limits"][name]:
            limit, peak = parse(after["limits"][name]), window_peak(frame, as_of, column)
            assert limit >= peak, (name, after, peak)
    if 0 < resumed < MIN_SAMPLES:
        # Resumed after 14+ days with under an hour of new samples: nothing to size from, the pod is left alone.
        assert rec.memory is None and rec.cpu is None and after == resources


@given(
    times=st.lists(st.integers(0, 30 * DAY), min_size=1, max_size=40),
    split=st.integers(0, 40),
    half_life_hours=st.sampled_from([12.0, 24.0]),
)
def test_recent_samples_halve_per_half_life_and_continue_exactly(
    times: list[int], split: int, half_life_hours: float
) -> None:
    ordered = np.sort(np.asarray(times, dtype=np.float64)) + END
    frame = pd.DataFrame({"group": "g", "timestamp": ordered, "value": 1.0})
    half_life = half_life_hours * 3600
    expected = np.exp2(-(ordered.max() - ordered) / half_life).sum()
    whole = DecayingHistogram(half_life_seconds=half_life, sample_weight=0.1).fit(frame)
    assert abs(whole.recent_samples()[0] - expected) < 1e-9 * len(times)
    parts = DecayingHistogram(half_life_seconds=half_life, sample_weight=0.1).fit(
        frame.iloc[:split] if split else frame
    )
    if 0 < split < len(frame):
        parts.partial_fit(frame.iloc[split:])
    assert abs(parts.recent_samples()[0] - expected) < 1e-9 * len(times)


def test_a_container_that_enters_in_a_live_pass_has_its_peak_as_the_limit_floor() -> None:
    """It has no row of the forecast grid until the next training: its floor comes from the short-term line's week."""
    fleet = make_usage(workloads=1, pods=1, days=2, start=END - 2 * DAY)
    late = fleet[fleet["workload"] == "w0"].tail(15).assign(workload="late", pod="late-1", memory_bytes=100.0 * MIB)
    late.iloc[8, late.columns.get_loc("memory_bytes")] = 3000.0 * MIB
    model = WorkloadRecommender().fit(pd.concat([fleet, late.head(5)], ignore_index=True))
    for _, row in late.iloc[5:].iterrows():
        model.live_update(pd.DataFrame([row]).astype({"timestamp": "int64"}))
    rec = {r.workload: r for r in model.predict().recommendations}["late"]
    assert rec.memory is not None and rec.memory.limit_floor == 3000.0 * MIB * 1.15


def test_a_cpu_limit_is_never_cut_under_a_burst_of_the_window() -> None:
    """The demo's job-382417448240 (issue 39): a request sized at 41m beside bursts to 761m was patched to a 42m
    limit, throttling every burst. The limit keeps the window's highest usage; the request is still sized low."""
    frame = make_usage(workloads=1, pods=1, days=10, start=END - 10 * DAY).assign(cpu_cores=0.02)
    frame.iloc[-2000, frame.columns.get_loc("cpu_cores")] = 0.761
    rec = WorkloadRecommender().fit(frame).predict().recommendations[0]
    resources = {"requests": {"cpu": "160m"}, "limits": {"cpu": "162m"}}
    original = pod("deployment", "w0", [container("main", resources)])
    webhook = WebhookSettings(policies=[WebhookPolicy(controlled_values="RequestsAndLimits")])
    lookup = {WorkloadKey("ns", "w0", "main"): rec}.get
    after = mutate(original, "ns", lookup, webhook, "v1", OptIn("Initial", "test")).pod["spec"]["containers"][0]
    assert rec.cpu is not None and rec.cpu.target < 0.05 and rec.cpu.limit_floor == 0.761
    assert cpu_cores_from_quantity(after["resources"]["requests"]["cpu"]) < 0.05
    assert after["resources"]["limits"]["cpu"] == "761m" and rec.cpu.limit == 0.761
