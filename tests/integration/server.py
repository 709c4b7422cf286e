"""Start `recommender serve` as a real process on loopback and wait (bounded) until it answers."""

from __future__ import annotations

import os
import socket
import ssl
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest

from tests.conftest import entry_point


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@contextmanager
def serving(
    store: Path, cwd: Path, *, tls: tuple[Path, Path] | None = None, verify: ssl.SSLContext | bool = True,
    env: dict[str, str] | None = None, ready_status: int = 200,
) -> Iterator[str]:
    """The base URL of a running server; stopped (terminate, then kill) on exit. At most 300 polls over 30 s."""
    port = free_port()
    command = [entry_point(), "serve", "--store", str(store), "--host", "127.0.0.1", "--port", str(port)]
    if tls is not None:
        command += ["--tls-cert-file", str(tls[0]), "--tls-key-file", str(tls[1])]
    process = subprocess.Popen(
        command, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL,
        env={**os.environ, **(env or {})},
    )
    base = f"{'https' if tls else 'http'}://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        for _ in range(300):
            if process.poll() is not None or time.monotonic() > deadline:
                break
            try:
                if httpx.get(base + "/readyz", timeout=1, verify=verify).status_code == ready_status:
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
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=10)
