"""Start `recommender serve` as a real process on loopback and wait (bounded) until it answers."""

from __future__ import annotations

import os
import socket
import ssl
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO

import httpx
import pytest
import trustme

from tests.conftest import entry_point


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def tls_files(directory: Path, name: str = "tls") -> tuple[trustme.CA, Path, Path, Path]:
    """A new CA and a certificate for 127.0.0.1 it signed: (CA, <name>.crt, <name>.key, <name>-ca.crt)."""
    ca = trustme.CA()
    leaf = ca.issue_cert("127.0.0.1", "localhost")
    cert, key, ca_file = directory / f"{name}.crt", directory / f"{name}.key", directory / f"{name}-ca.crt"
    leaf.cert_chain_pems[0].write_to_path(str(cert))
    leaf.private_key_pem.write_to_path(str(key))
    ca.cert_pem.write_to_path(str(ca_file))
    return ca, cert, key, ca_file


def fake_apiserver_command(api: str, cert: Path, key: Path) -> list[str]:
    """uvicorn serving `tests.fake_apiserver` (TokenReview, SubjectAccessReview, pod lists) over TLS at `api`."""
    port = api.rsplit(":", 1)[1]
    tls = ["--ssl-certfile", str(cert), "--ssl-keyfile", str(key)]
    return [sys.executable, "-m", "uvicorn", "tests.fake_apiserver:app", "--port", port, *tls]


@contextmanager
def started(
    command: list[str],
    base: str,
    *,
    cwd: Path,
    verify: ssl.SSLContext | str | bool = True,
    env: dict[str, str] | None = None,
    ready_path: str = "/readyz",
    ready_status: int = 200,
    wait_seconds: float = 30,
) -> Iterator[IO[bytes]]:
    """Run `command` until the block ends (terminate, then kill); first wait, at most 10 polls a second for
    `wait_seconds`, until `base + ready_path` answers `ready_status`. Its logs go to the file yielded (a pipe
    nobody reads would fill and block it)."""
    logs = tempfile.TemporaryFile()  # noqa: SIM115 - open as long as the server it logs
    process = subprocess.Popen(
        command,
        cwd=cwd,
        stdout=logs,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        env={**os.environ, **(env or {})},
    )
    try:
        deadline = time.monotonic() + wait_seconds
        for _ in range(int(wait_seconds * 10)):
            if process.poll() is not None or time.monotonic() > deadline:
                break
            try:
                if httpx.get(base + ready_path, timeout=1, verify=verify).status_code == ready_status:
                    break
            except httpx.TransportError:
                pass
            time.sleep(0.1)
        else:
            pytest.fail(f"{command[0]} did not become ready")
        if process.poll() is not None:
            logs.seek(0)
            pytest.fail(f"{command[0]} exited: {logs.read().decode(errors='replace')[-2000:]}")
        yield logs
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=10)
        logs.close()


@contextmanager
def serving(
    store: Path,
    cwd: Path,
    *,
    tls: tuple[Path, Path] | None = None,
    verify: ssl.SSLContext | bool = True,
    env: dict[str, str] | None = None,
    ready_status: int = 200,
    port: int | None = None,
) -> Iterator[str]:
    """The base URL of a running `recommender serve` over `store` (on `port`, else a free one)."""
    port = port or free_port()
    command = [entry_point(), "serve", "--store", str(store), "--host", "127.0.0.1", "--port", str(port)]
    if tls is not None:
        command += ["--tls-cert-file", str(tls[0]), "--tls-key-file", str(tls[1])]
    base = f"{'https' if tls else 'http'}://127.0.0.1:{port}"
    with started(command, base, cwd=cwd, verify=verify, env=env, ready_status=ready_status):
        yield base
