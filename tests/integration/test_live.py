"""The live loop against a real Prometheus scraping a test exporter on 127.0.0.1 every second, whose usage changes
during the test; the loop runs every 2 s on 2-second steps, over a version trained on 3 days of history.

A step up in CPU is served (short-term line and request, and the node room of its pod's node, which drops) within two
loops of the step being readable, an OOM kill raises memory within one; with Prometheus killed the last lines stay
served and age, then the loop catches up; a loop killed with SIGKILL resumes from its checkpoint, replays only what it
missed, and ends with the histograms of one uninterrupted read."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from fastapi.testclient import TestClient

from cli.settings import Settings
from models.store import LiveUpdate, ModelStore
from pipelines.live import LiveLoop, LoopState
from pipelines.train import train_from_file
from recommender.resources import WorkloadRecommendation
from serving.app import create_app
from serving.state import ServiceState
from tests.conftest import entry_point
from tests.support.live_exporter import Container, LiveExporter, live_environment, wait_for_scrapes, write_history
from tests.support.prometheus_server import PrometheusServer, binaries_present

pytestmark = pytest.mark.integration
MIB = 2**20
#: A step is fully readable once the rate window (4 s) after it and one scrape (1 s) have passed.
READABLE_AFTER_SECONDS = 5
INTERVAL_SECONDS = 2


@pytest.fixture(scope="module")
def exporter() -> Iterator[LiveExporter]:
    pod = "web-5d4f8b9c7-abcde"
    live = LiveExporter(
        [
            Container("shop", "web", pod, "main", cpu_cores=0.2, memory_bytes=300 * MIB, memory_limit_bytes=1024 * MIB),
            Container(
                "shop", "web", pod, "sidecar", cpu_cores=0.05, memory_bytes=100 * MIB, memory_limit_bytes=512 * MIB
            ),
        ]
    ).start()
    yield live
    live.stop()


def _prometheus(exporter: LiveExporter, workdir: Path) -> PrometheusServer:
    if not binaries_present():
        pytest.skip("Debian's prometheus package is missing: `make test` installs it (scripts/install-test-deps.sh)")
    server = PrometheusServer(None, workdir, scrape=[exporter.target]).start()
    wait_for_scrapes(server.url)
    return server


@pytest.fixture(scope="module")
def prometheus(exporter: LiveExporter, tmp_path_factory: pytest.TempPathFactory) -> Iterator[PrometheusServer]:
    server = _prometheus(exporter, tmp_path_factory.mktemp("prometheus"))
    yield server
    server.stop()


NODE = "node-0"


def trained(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, exporter: LiveExporter, url: str) -> Settings:
    """Settings of a loop over `url` and a store holding a version trained on 3 days that end now; `serve` knows
    the exporter's node (4 cores, 8 GiB allocatable) from a nodes file."""
    for name, value in live_environment(url, tmp_path / "store").items():
        monkeypatch.setenv(name, value)
    nodes = {"items": [{"metadata": {"name": NODE}, "status": {"allocatable": {"cpu": "4", "memory": "8Gi"}}}]}
    (tmp_path / "nodes.json").write_text(json.dumps(nodes))
    monkeypatch.setenv("KOORD_RECOMMENDER_EXTENDER__NODES_FILE", str(tmp_path / "nodes.json"))
    settings = Settings()
    write_history(list(exporter.containers.values()), tmp_path / "usage.csv", int(time.time()))
    train_from_file(tmp_path / "usage.csv", settings, end_at=int(time.time()))
    return settings


def served(state: ServiceState, container: str = "main") -> WorkloadRecommendation:
    state.refresh_if_published()
    found = next(r for r in state.require().loaded.recommendations.recommendations if r.container == container)
    return found


def wait_until(check: Callable[[], Any], timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = check()
        if found:
            return found
        time.sleep(0.25)
    raise AssertionError(f"not within {timeout} s: {what}")


class Running:
    """A `LiveLoop` running in a thread, as `recommender live` runs it."""

    def __init__(self, settings: Settings) -> None:
        self.loop = LiveLoop(settings, ModelStore(settings.store.path))
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.loop.run, args=(self.stop,), daemon=True)

    def __enter__(self) -> LiveLoop:
        self.thread.start()
        return self.loop

    def __exit__(self, *_: object) -> None:
        self.stop.set()
        self.thread.join(timeout=30)
        assert not self.thread.is_alive()


def first_covering(store: ModelStore, after: float, timeout: float) -> tuple[LiveUpdate, WorkloadRecommendation]:
    """The first update whose read reaches `after` (polled as a `serve` replica polls), with main's lines."""

    def covering() -> tuple[LiveUpdate, WorkloadRecommendation] | None:
        update = store.live_update()
        if update is None or update.last_sample < after:
            return None
        recs = store.load_live(update).recommendations
        return update, next(r for r in recs if r.container == "main")

    found: tuple[LiveUpdate, WorkloadRecommendation] = wait_until(covering, timeout, f"an update reaching {after}")
    return found


def node_room(settings: Settings) -> dict[str, Any]:
    """The CPU room of the exporter's node as a `serve` replica starting now serves it
    (`GET /api/v1/nodes/{node}/lines`, over the newest live update)."""
    with TestClient(create_app(settings)) as http:
        found: dict[str, Any] = http.get(f"/api/v1/nodes/{NODE}/lines").json()["cpu_cores"]["reclaimable"]
    return found


def node_cpu_measured(store: ModelStore) -> float:
    """The exporter's node's CPU usage as the newest live update measured it (NaN before one measured it)."""
    update = store.live_update()
    if update is None:
        return float("nan")
    found = next((n for n in store.load_live(update).nodes if n.node == NODE), None)
    if found is None or found.cpu is None or found.cpu.live_usage is None:
        return float("nan")
    return float(found.cpu.live_usage)


def test_a_step_up_and_an_oom_kill_are_served_within_loops(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, exporter: LiveExporter, prometheus: PrometheusServer
) -> None:
    settings = trained(tmp_path, monkeypatch, exporter, prometheus.url)
    store = ModelStore(settings.store.path)
    state = ServiceState(store)
    with Running(settings):
        wait_until(lambda: served(state) and state.require().live is not None, 30, "a first live update served")
        before = served(state)
        assert before.cpu is not None and before.memory is not None
        assert before.cpu.target < 0.5 and before.cpu.short_term[0] < 0.5
        # The room before the step is taken once the loop measures the node at the exporter's steady level (main +
        # sidecar: 0.25 cores): the first updates after Prometheus starts read rate windows with too few scrapes, where
        # a container without a sample counts at its request (Koordinator's rule), so the node reads 0.5 there.
        wait_until(lambda: abs(node_cpu_measured(store) - 0.25) < 0.02, 30, "the node measured at 0.25 cores")
        room_before = node_room(settings)
        assert abs(node_cpu_measured(store) - 0.25) < 0.02
        assert room_before["policy"] == "live", room_before
        stepped = exporter.set("main", cpu_cores=1.0)
        readable = stepped + READABLE_AFTER_SECONDS
        # The first update whose read covers the step's readable end, and the one after it at the latest: two loops.
        update, rec = first_covering(store, readable, 30)
        if not (rec.cpu and rec.cpu.short_term[0] >= 0.9 and rec.cpu.target >= 0.9):
            update, rec = first_covering(store, update.last_sample + settings.prometheus.step_seconds, 10)
        assert rec.cpu is not None
        assert rec.cpu.short_term[0] >= 0.9, rec.cpu.short_term[:3]
        assert rec.cpu.target >= 0.9, rec.cpu.target
        assert update.written_at - stepped < 2 * INTERVAL_SECONDS + READABLE_AFTER_SECONDS + 2 + 3  # lag, slack
        # Served by `serve`'s reload: the REST answer says which update and how old.
        assert served(state).cpu.target >= 0.9  # type: ignore[union-attr]
        # The same update measured the node (main + sidecar: 1.05 cores), and the room `serve` offers drops by the
        # step, less the rise above the level (the node's rise table) the room before it already kept free.
        measured = next(n for n in store.load_live(update).nodes if n.node == NODE)
        assert measured.cpu is not None and measured.cpu.live_usage is not None
        assert measured.cpu.live_usage >= 1.0, measured.cpu.live_usage
        room_after = node_room(settings)
        assert room_after["policy"] == "live"
        # The room before kept free at most the table's largest rise (a pod starting on the idle node is one).
        kept = max(measured.cpu.live_rise or [0.0])
        assert kept < 0.5, measured.cpu.live_rise
        assert room_after["batch"] <= room_before["batch"] - (0.75 - kept), (room_before, room_after, kept)

        memory_before = served(state).memory.target  # type: ignore[union-attr]
        killed = exporter.oom_kill("main")
        update, rec = first_covering(store, killed + READABLE_AFTER_SECONDS, 30)
        assert rec.history.oom_kills == 1
        assert rec.memory is not None and rec.memory.target > 1.2 * memory_before, (rec.memory, memory_before)
        with TestClient(create_app(settings)) as http:
            listed = http.get("/api/v1/recommendations").json()
            ready = http.get("/readyz").json()
        assert listed["live_update"]["version"] == store.latest_name()
        assert listed["live_update"]["sequence"] >= update.sequence
        assert 0 <= listed["age_seconds"] < 30
        assert ready["live_update"].startswith(store.latest_name() + "+live.")
    exporter.set("main", cpu_cores=0.2)


def test_prometheus_down_keeps_the_lines_served_then_the_loop_catches_up(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, exporter: LiveExporter
) -> None:
    own = _prometheus(exporter, tmp_path / "prometheus")
    try:
        settings = trained(tmp_path, monkeypatch, exporter, own.url)
        store = ModelStore(settings.store.path)
        state = ServiceState(store)
        with Running(settings) as loop:
            wait_until(lambda: served(state) and state.require().live is not None, 30, "a first live update served")
            own.kill()
            down = time.time()
            time.sleep(3 * INTERVAL_SECONDS)
            before = store.live_update()
            assert before is not None
            wait_until(
                lambda: (
                    (
                        loop.metrics.registry.get_sample_value(
                            "koord_recommender_live_errors_total", {"reason": "prometheus"}
                        )
                        or 0
                    )
                    >= 1
                ),
                20,
                "a failed pass counted",
            )
            time.sleep(INTERVAL_SECONDS)
            # Nothing written meanwhile; the same lines are served and only age.
            assert store.live_update() == before
            assert served(state) is not None and state.require().revision == before.revision
            assert state.require().age_seconds() >= time.time() - down - 1
            last_success = loop.metrics.registry.get_sample_value(
                "koord_recommender_live_last_success_timestamp_seconds"
            )
            assert last_success is not None and last_success < down + 1
            own.start()
            caught = wait_until(
                lambda: (u := store.live_update()) is not None and u.last_sample > time.time() - 10 and u,
                40,
                "an update after Prometheus came back",
            )
            # The read after the outage starts where the last good one ended: the gap is read, not skipped.
            assert caught.sequence > before.sequence
            assert loop.state is not None and loop.state.last_sample >= caught.last_sample
    finally:
        own.stop()


def _start(env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [entry_point(), "live"],
        env={**os.environ, **env},
        stdout=subprocess.DEVNULL,
        stderr=open(log, "wb"),
        start_new_session=True,
    )


def _messages(log: Path) -> list[str]:
    out = []
    for line in log.read_text().splitlines():
        try:
            out.append(json.loads(line)["message"])
        except (ValueError, KeyError):
            continue
    return out


def test_a_loop_killed_with_sigkill_resumes_from_its_checkpoint_with_the_histograms_of_one_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, exporter: LiveExporter, prometheus: PrometheusServer
) -> None:
    settings = trained(tmp_path, monkeypatch, exporter, prometheus.url)
    env = live_environment(prometheus.url, Path(settings.store.path))
    store = ModelStore(settings.store.path)
    pristine = tmp_path / "pristine"
    shutil.copytree(settings.store.path, pristine)  # the version alone, for the one-read reference
    first = _start(env, tmp_path / "first.log")
    try:
        wait_until(lambda: (u := store.live_update()) is not None and u.sequence >= 4, 40, "four updates")
        checkpoint = store.load_live_checkpoint()
        assert isinstance(checkpoint, LoopState)
        first.send_signal(signal.SIGKILL)
        first.wait(timeout=10)
        killed_at = store.live_update()
        assert killed_at is not None
    finally:
        if first.poll() is None:
            first.kill()
    exporter.set("sidecar", cpu_cores=0.15)  # usage moves while the loop is down: the replay must bring it
    time.sleep(2 * INTERVAL_SECONDS)
    second = _start(env, tmp_path / "second.log")
    try:
        wait_until(
            lambda: (u := store.live_update()) is not None and u.sequence >= killed_at.sequence + 3, 40, "three more"
        )
        second.send_signal(signal.SIGTERM)  # a clean stop writes a last checkpoint
        second.wait(timeout=30)
    finally:
        if second.poll() is None:
            second.kill()
        exporter.set("sidecar", cpu_cores=0.05)
    messages = _messages(tmp_path / "second.log")
    resumed = next(m for m in messages if m.startswith("resuming from the checkpoint"))
    saved_at = int(resumed.split(" at ")[1].split(" ")[0])
    first_read = next(m for m in messages if m.startswith("read "))
    # Only what it missed: the first read of the restarted loop begins one step after a checkpoint of the first.
    assert f" of {saved_at + settings.prometheus.step_seconds}.." in first_read, first_read
    assert saved_at >= checkpoint.last_sample
    final = store.load_live_checkpoint()
    assert isinstance(final, LoopState) and final.last_sample > killed_at.last_sample

    # The reference: the same version continued by one read up to the same end, as one uninterrupted loop reads.
    reference_settings = settings.model_copy(
        update={"store": settings.store.model_copy(update={"path": str(pristine)})}
    )
    reference = LiveLoop(
        reference_settings,
        ModelStore(pristine),
        clock=lambda: final.last_sample + settings.live.read_lag_seconds + 0.5,
    )
    report = reference.step()
    assert report is not None and report.end == final.last_sample
    ours, theirs = final.model, reference.state.model  # type: ignore[union-attr]
    assert list(ours.cpu_histogram_.groups_) == list(theirs.cpu_histogram_.groups_)
    np.testing.assert_allclose(ours.cpu_histogram_.weights(), theirs.cpu_histogram_.weights(), rtol=1e-9, atol=1e-12)
    np.testing.assert_array_equal(ours.cpu_histogram_.sample_count_, theirs.cpu_histogram_.sample_count_)
    assert ours.memory_histogram_.peaks_.equals(theirs.memory_histogram_.peaks_)
    np.testing.assert_allclose(ours.cpu_grid_, theirs.cpu_grid_, rtol=1e-9, equal_nan=True)
