"""Leader election of the live loop on a coordination.k8s.io/v1 Lease of a real apiserver: of two candidates one
holds the Lease; of two `recommender live` replicas over one store, one writes, and the other takes over when it
stops, continuing the sequence."""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from kubernetes import client

from cli.settings import Settings
from models.store import ModelStore
from pipelines.train import train_from_file
from serving.lease import LeaseElector
from tests.conftest import entry_point
from tests.support.control_plane import ControlPlane
from tests.support.live_exporter import Container, LiveExporter, live_environment, wait_for_scrapes, write_history
from tests.support.prometheus_server import PrometheusServer, binaries_present

LEASE_SECONDS = 3


def test_of_two_candidates_one_holds_the_lease_until_it_stops_renewing(plane: ControlPlane) -> None:
    api = plane.api()
    first = LeaseElector(api, "live-unit", "default", LEASE_SECONDS, holder="first")
    second = LeaseElector(api, "live-unit", "default", LEASE_SECONDS, holder="second")
    assert first.try_acquire_or_renew() and first.leading()
    assert not second.try_acquire_or_renew() and not second.leading()
    assert first.try_acquire_or_renew()  # renewing keeps it
    assert not second.try_acquire_or_renew()
    # The holder stops renewing: it stops saying it leads before anyone may take over, then the other takes it.
    deadline = time.monotonic() + 3 * LEASE_SECONDS
    while first.leading() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not first.leading()
    assert not second.try_acquire_or_renew(), "taken before the holder's lease ran out"
    time.sleep(LEASE_SECONDS / 3 + 0.2)
    assert second.try_acquire_or_renew() and second.leading()
    lease = client.CoordinationV1Api(api).read_namespaced_lease("live-unit", "default")
    assert lease.spec.holder_identity == "second" and lease.spec.lease_transitions == 1
    second.release()
    assert first.try_acquire_or_renew(), "a released Lease is free at once"


@pytest.fixture
def live_prometheus(tmp_path: Path) -> Iterator[tuple[LiveExporter, PrometheusServer]]:
    if not binaries_present():
        pytest.skip("Debian's prometheus package is missing: `make test` installs it (scripts/install-test-deps.sh)")
    exporter = LiveExporter([Container("shop", "web", "web-5d4f8b9c7-abcde", "main", 0.2, 300 * 2**20, 2**30)]).start()
    server = PrometheusServer(None, tmp_path / "prometheus", scrape=[exporter.target]).start()
    try:
        wait_for_scrapes(server.url)
        yield exporter, server
    finally:
        server.stop()
        exporter.stop()


def test_of_two_live_replicas_one_writes_and_the_other_takes_over(
    plane: ControlPlane,
    live_prometheus: tuple[LiveExporter, PrometheusServer],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    exporter, prometheus = live_prometheus
    env = {
        **live_environment(prometheus.url, tmp_path / "store"),
        "KOORD_RECOMMENDER_LIVE__LEADER_ELECTION": "true",
        "KOORD_RECOMMENDER_LIVE__KUBECONFIG": str(plane.kubeconfig),
        "KOORD_RECOMMENDER_LIVE__LEASE_NAMESPACE": "default",
        "KOORD_RECOMMENDER_LIVE__LEASE_DURATION_SECONDS": str(LEASE_SECONDS),
    }
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    write_history(list(exporter.containers.values()), tmp_path / "usage.csv", int(time.time()))
    train_from_file(tmp_path / "usage.csv", Settings(), end_at=int(time.time()))
    store = ModelStore(tmp_path / "store")
    replicas = [
        subprocess.Popen(
            [entry_point(), "live"],
            env={**os.environ, **env},
            stdout=subprocess.DEVNULL,
            stderr=open(tmp_path / f"replica-{i}.log", "wb"),  # noqa: SIM115 - open while it runs
            start_new_session=True,
        )
        for i in range(2)
    ]
    writers: list[tuple[int, str]] = []
    stop = threading.Event()

    def watch() -> None:
        while not stop.is_set():
            update = store.live_update()
            if update is not None and (not writers or writers[-1][0] != update.sequence):
                writers.append((update.sequence, update.writer))
            time.sleep(0.1)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        deadline = time.monotonic() + 60
        while len(writers) < 5 and time.monotonic() < deadline:
            time.sleep(0.2)
        assert len(writers) >= 5, writers
        assert len({writer for _, writer in writers}) == 1, f"two replicas wrote: {writers}"
        leader = writers[-1][1]
        lease = client.CoordinationV1Api(plane.api()).read_namespaced_lease("koord-recommender-live", "default")
        assert lease.spec.holder_identity == leader
        # Stop the leader (SIGTERM: it checkpoints and releases the Lease); the other continues the sequence.
        index = next(i for i in range(2) if f"as {leader}" in (tmp_path / f"replica-{i}.log").read_text())
        replicas[index].send_signal(signal.SIGTERM)
        replicas[index].wait(timeout=30)
        seen = len(writers)
        deadline = time.monotonic() + 60
        while not any(writer != leader for _, writer in writers[seen:]) and time.monotonic() < deadline:
            time.sleep(0.2)
        after = [(sequence, writer) for sequence, writer in writers[seen:] if writer != leader]
        assert after, f"no update from the other replica: {writers}"
        assert after[0][0] > writers[seen - 1][0], "the sequence must go on"
        assert "resuming from the checkpoint" in (tmp_path / f"replica-{1 - index}.log").read_text()
    finally:
        stop.set()
        watcher.join(timeout=5)
        for replica in replicas:
            if replica.poll() is None:
                replica.send_signal(signal.SIGTERM)
                try:
                    replica.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    replica.kill()
