"""`recommender serve` as a real uvicorn process on loopback, over the store a real `train` wrote."""

from __future__ import annotations

import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.conftest import Runner, entry_point

pytestmark = pytest.mark.integration


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@pytest.fixture
def server(cli: Runner, tmp_path: Path, usage_csv: Path) -> Iterator[str]:
    assert cli("train", "--input", str(usage_csv), "--store", "store").returncode == 0
    port = free_port()
    process = subprocess.Popen(
        [entry_point(), "serve", "--store", "store", "--host", "127.0.0.1", "--port", str(port)],
        cwd=tmp_path,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        for _ in range(300):  # bounded: at most 300 polls, 30 s
            if process.poll() is not None or time.monotonic() > deadline:
                break
            try:
                if httpx.get(base + "/readyz", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            time.sleep(0.1)
        else:
            pytest.fail("server did not become ready")
        assert process.poll() is None, process.stderr.read().decode() if process.stderr else ""
        yield base
    finally:
        process.terminate()
        process.wait(timeout=10)


def test_health_list_one_and_docs(server: str) -> None:
    assert httpx.get(server + "/healthz").json() == {"status": "ok"}
    listed = httpx.get(server + "/api/v1/recommendations").json()
    assert {r["workload"] for r in listed["recommendations"]} == {"w0", "w1"}
    filtered = httpx.get(server + "/api/v1/recommendations", params={"workload": "w1"}).json()
    assert [r["workload"] for r in filtered["recommendations"]] == ["w1"]
    one = httpx.get(server + "/api/v1/recommendations/ns/w0/main").json()
    assert len(one["cpu"]["short_term"]) == 288 and one["current"]["cpu_limit_cores"] == 2.0
    assert len(httpx.get(server + "/api/v1/recommendations/ns/w0").json()) == 1
    assert httpx.get(server + "/api/v1/version").json()["version"] == listed["version"]
    assert httpx.get(server + "/docs").status_code == 200
    assert "/api/v1/recommendations" in httpx.get(server + "/openapi.json").json()["paths"]


def test_unknown_workload_is_404_with_reason(server: str) -> None:
    response = httpx.get(server + "/api/v1/recommendations/ns/nope/main")
    assert response.status_code == 404
    assert response.json()["detail"] == "no recommendation for ns/nope/main"


def test_not_ready_without_a_model(tmp_path: Path) -> None:
    port = free_port()
    process = subprocess.Popen(
        [entry_point(), "serve", "--store", str(tmp_path / "empty"), "--port", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        stdin=subprocess.DEVNULL,
    )
    try:
        response = None
        for _ in range(300):
            try:
                response = httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=1)
                break
            except httpx.TransportError:
                time.sleep(0.1)
        assert response is not None and response.status_code == 503
        assert "no model version published yet" in response.json()["detail"]
        listed = httpx.get(f"http://127.0.0.1:{port}/api/v1/recommendations")
        assert listed.status_code == 503
    finally:
        process.terminate()
        process.wait(timeout=10)
