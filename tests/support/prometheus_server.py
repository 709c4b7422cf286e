"""A real Prometheus on 127.0.0.1, backfilled from an OpenMetrics file with promtool, and a front that fails some of
its queries."""

from __future__ import annotations

import shutil
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs

import httpx


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def binaries_present() -> bool:
    return shutil.which("prometheus") is not None and shutil.which("promtool") is not None


class PrometheusServer:
    """Backfills `openmetrics` into a TSDB under `workdir` (or copies an existing TSDB) and serves it on loopback."""

    def __init__(
        self,
        openmetrics: Path | None,
        workdir: Path,
        copy_tsdb_from: Path | None = None,
        scrape: list[str] | None = None,
        scrape_interval_seconds: float = 1.0,
    ) -> None:
        """`scrape`: host:port targets on loopback to scrape every `scrape_interval_seconds` (an empty TSDB to start
        is then fine: the live loop's tests read what the scrapes bring)."""
        self.workdir = workdir
        self.data = workdir / "tsdb"
        self.query_log = workdir / "queries.log"
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.process: subprocess.Popen[bytes] | None = None
        workdir.mkdir(parents=True, exist_ok=True)
        if copy_tsdb_from is not None:
            shutil.copytree(copy_tsdb_from, self.data, ignore=shutil.ignore_patterns("lock", "wal", "queries.active"))
        elif openmetrics is not None:
            self.data.mkdir(parents=True, exist_ok=True)
            result = subprocess.run(
                [
                    "promtool",
                    "tsdb",
                    "create-blocks-from",
                    "openmetrics",
                    "--max-block-duration=744h",
                    str(openmetrics),
                    str(self.data),
                ],
                capture_output=True,
                text=True,
                timeout=900,
            )
            if result.returncode != 0:
                raise RuntimeError(f"promtool backfill failed: {result.stderr[-2000:]}")
        elif not scrape:
            raise ValueError("give an OpenMetrics file, a TSDB to copy or targets to scrape")
        jobs = (
            f"scrape_configs:\n  - job_name: live\n    honor_labels: true\n    scrape_interval: {scrape_interval_seconds * 1000:.0f}ms\n"
            f"    scrape_timeout: {scrape_interval_seconds * 1000:.0f}ms\n    static_configs:\n      - targets: {list(scrape)}\n"
            if scrape
            else "scrape_configs: []\n"
        )
        (workdir / "prometheus.yml").write_text(f"global:\n  query_log_file: {self.query_log}\n{jobs}")

    def start(self, timeout: float = 60, extra_args: list[str] | None = None) -> PrometheusServer:
        self.process = subprocess.Popen(
            [
                "prometheus",
                f"--config.file={self.workdir / 'prometheus.yml'}",
                f"--storage.tsdb.path={self.data}",
                "--storage.tsdb.retention.time=100y",
                f"--web.listen-address=127.0.0.1:{self.port}",
                "--query.max-samples=200000000",
                *(extra_args or []),
            ],
            stdout=subprocess.DEVNULL,
            stderr=open(self.workdir / "prometheus.stderr", "wb"),  # noqa: SIM115 - open as long as Prometheus runs
            stdin=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"prometheus exited: {(self.workdir / 'prometheus.stderr').read_text()[-2000:]}")
            try:
                if httpx.get(self.url + "/-/ready", timeout=2).status_code == 200:
                    return self
            except httpx.TransportError:
                pass
            time.sleep(0.2)
        self.stop()
        raise RuntimeError("prometheus did not become ready in time")

    def kill(self) -> None:
        if self.process and self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait(timeout=10)

    def stop(self) -> None:
        if self.process and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.kill()

    def queries_logged(self) -> int:
        return len(self.query_log.read_text().splitlines()) if self.query_log.exists() else 0


class FailingProxy:
    """A loopback HTTP front of a real Prometheus that answers 503 to the queries `fails(path, form)` picks and
    forwards every other request as it is: one namespace's usage batches failing, for a run's other processes too."""

    def __init__(self, target: str, fails: Callable[[str, dict[str, list[str]]], bool]) -> None:
        self.target = target
        self.fails = fails
        self.failed = 0
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                self._forward(b"")

            def do_POST(self) -> None:
                self._forward(self.rfile.read(int(self.headers.get("Content-Length", 0))))

            def _forward(self, body: bytes) -> None:
                path = self.path.split("?", 1)[0]
                if proxy.fails(path, parse_qs(body.decode())):
                    proxy.failed += 1
                    answer = httpx.Response(
                        503, json={"status": "error", "errorType": "unavailable", "error": "injected"}
                    )
                else:
                    headers = {k: v for k, v in self.headers.items() if k.lower() in ("content-type", "accept")}
                    answer = httpx.request(
                        self.command, proxy.target + self.path, content=body, headers=headers, timeout=60
                    )
                self.send_response(answer.status_code)
                self.send_header("Content-Type", answer.headers.get("content-type", "application/json"))
                self.send_header("Content-Length", str(len(answer.content)))
                self.end_headers()
                self.wfile.write(answer.content)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> FailingProxy:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=10)
