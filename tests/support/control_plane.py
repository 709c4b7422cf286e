"""A real Kubernetes control plane on 127.0.0.1: etcd, kube-apiserver, and optionally kube-controller-manager
and kube-scheduler, from the binaries scripts/build-control-plane.sh builds (cached outside git).

There is no kubelet: tests create Node objects themselves; pods get scheduled (bound) but never run, which is all
the webhook, extender and status-writer tests need. Every wait is bounded.
"""

from __future__ import annotations

import base64
import os
import shutil
import signal
import ssl
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import yaml
from kubernetes import client, config

from tests.support.pki import CertificateAuthority, service_account_keys
from tests.support.prometheus_server import free_port

REPO = Path(__file__).resolve().parents[2]
K8S_VERSION = "1.34.2"


def control_plane_binaries() -> Path | None:
    """Where the cached binaries are, or None when they are not built (and cannot be built here)."""
    cache = Path(os.environ.get("KOORD_E2E_CACHE", Path.home() / ".cache" / "koord-recommender"))
    binaries = cache / f"control-plane-v{K8S_VERSION}" / "bin"
    needed = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler")
    if all((binaries / b).exists() for b in needed):
        return binaries
    return None


def crd_files() -> list[Path]:
    """CRD manifests of VPA and Koordinator, as shipped in their Go modules (fetched by build-control-plane.sh)."""
    cache = Path(os.environ.get("KOORD_E2E_CACHE", Path.home() / ".cache" / "koord-recommender"))
    return sorted((cache / f"control-plane-v{K8S_VERSION}" / "crds").glob("*.yaml"))


class ControlPlane:
    def __init__(self, binaries: Path, workdir: Path) -> None:
        self.bin = binaries
        self.dir = workdir
        self.dir.mkdir(parents=True, exist_ok=True)
        self.processes: dict[str, subprocess.Popen[bytes]] = {}
        self.ca = CertificateAuthority(workdir / "pki")
        self.serving = self.ca.issue(
            "apiserver",
            common_name="kube-apiserver",
            dns=("localhost", "kubernetes", "kubernetes.default"),
            ips=("127.0.0.1",),
        )
        self.admin = self.ca.issue("admin", common_name="admin", organizations=("system:masters",), client=True)
        self.sa_key, self.sa_pub = service_account_keys(workdir / "pki")
        self.etcd_port, self.peer_port, self.api_port = free_port(), free_port(), free_port()
        self.url = f"https://127.0.0.1:{self.api_port}"
        self.kubeconfig = workdir / "kubeconfig"
        self.kubeconfig.write_text(
            yaml.safe_dump(
                {
                    "apiVersion": "v1",
                    "kind": "Config",
                    "clusters": [
                        {
                            "name": "e2e",
                            "cluster": {"server": self.url, "certificate-authority": str(self.ca.cert_path)},
                        }
                    ],
                    "users": [
                        {
                            "name": "admin",
                            "user": {"client-certificate": str(self.admin.cert), "client-key": str(self.admin.key)},
                        }
                    ],
                    "contexts": [{"name": "e2e", "context": {"cluster": "e2e", "user": "admin"}}],
                    "current-context": "e2e",
                }
            )
        )

    def _spawn(self, name: str, args: list[str]) -> None:
        log = open(self.dir / f"{name}.log", "wb")  # noqa: SIM115 - open as long as the process it logs
        self.processes[name] = subprocess.Popen(
            [str(self.bin / name), *args], stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
        )

    def _wait(self, name: str, url: str, timeout: float, **kwargs: Any) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            process = self.processes[name]
            if process.poll() is not None:
                raise RuntimeError(f"{name} exited: {(self.dir / f'{name}.log').read_text()[-3000:]}")
            try:
                if httpx.get(url, timeout=2, **kwargs).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.25)
        raise RuntimeError(f"{name} not ready after {timeout} s: {(self.dir / f'{name}.log').read_text()[-3000:]}")

    def start(
        self,
        *,
        controller_manager: bool = False,
        scheduler_config: dict[str, Any] | None = None,
        apiserver_args: tuple[str, ...] = (),
    ) -> ControlPlane:
        self._spawn(
            "etcd",
            [
                "--name=e2e",
                f"--data-dir={self.dir / 'etcd'}",
                f"--listen-client-urls=http://127.0.0.1:{self.etcd_port}",
                f"--advertise-client-urls=http://127.0.0.1:{self.etcd_port}",
                f"--listen-peer-urls=http://127.0.0.1:{self.peer_port}",
                f"--initial-advertise-peer-urls=http://127.0.0.1:{self.peer_port}",
                f"--initial-cluster=e2e=http://127.0.0.1:{self.peer_port}",
                "--unsafe-no-fsync",
                "--listen-metrics-urls=",
            ],
        )
        self._wait("etcd", f"http://127.0.0.1:{self.etcd_port}/health", 60)
        self._spawn(
            "kube-apiserver",
            [
                f"--etcd-servers=http://127.0.0.1:{self.etcd_port}",
                "--bind-address=127.0.0.1",
                "--advertise-address=127.0.0.1",
                f"--secure-port={self.api_port}",
                f"--cert-dir={self.dir / 'apiserver'}",
                f"--tls-cert-file={self.serving.cert}",
                f"--tls-private-key-file={self.serving.key}",
                f"--client-ca-file={self.ca.cert_path}",
                f"--service-account-key-file={self.sa_pub}",
                f"--service-account-signing-key-file={self.sa_key}",
                "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
                "--service-cluster-ip-range=10.0.0.0/24",
                "--authorization-mode=RBAC",
                "--allow-privileged=true",
                "--profiling=false",
                *apiserver_args,
            ],
        )
        admin = ssl.create_default_context(cafile=str(self.ca.cert_path))
        admin.load_cert_chain(str(self.admin.cert), str(self.admin.key))
        self._wait("kube-apiserver", self.url + "/readyz", 120, verify=admin)
        if controller_manager:
            port = free_port()
            self._spawn(
                "kube-controller-manager",
                [
                    f"--kubeconfig={self.kubeconfig}",
                    f"--authentication-kubeconfig={self.kubeconfig}",
                    f"--authorization-kubeconfig={self.kubeconfig}",
                    "--leader-elect=false",
                    "--bind-address=127.0.0.1",
                    f"--secure-port={port}",
                    "--controllers=*,-node-lifecycle-controller,-node-ipam-controller,-cloud-node-lifecycle-controller",
                    f"--service-account-private-key-file={self.sa_key}",
                    f"--root-ca-file={self.ca.cert_path}",
                    "--use-service-account-credentials=false",
                ],
            )
            self._wait("kube-controller-manager", f"https://127.0.0.1:{port}/healthz", 120, verify=False)
        if scheduler_config is not None:
            port = free_port()
            path = self.dir / "scheduler.yaml"
            path.write_text(
                yaml.safe_dump(
                    {
                        "apiVersion": "kubescheduler.config.k8s.io/v1",
                        "kind": "KubeSchedulerConfiguration",
                        "clientConnection": {"kubeconfig": str(self.kubeconfig)},
                        "leaderElection": {"leaderElect": False},
                        **scheduler_config,
                    }
                )
            )
            self._spawn(
                "kube-scheduler",
                [
                    f"--config={path}",
                    "--bind-address=127.0.0.1",
                    f"--secure-port={port}",
                    f"--authentication-kubeconfig={self.kubeconfig}",
                    f"--authorization-kubeconfig={self.kubeconfig}",
                ],
            )
            self._wait("kube-scheduler", f"https://127.0.0.1:{port}/healthz", 120, verify=False)
        return self

    def api(self) -> client.ApiClient:
        api: client.ApiClient = config.new_client_from_config(config_file=str(self.kubeconfig))
        return api

    def install_crds(self, paths: list[Path], timeout: float = 60) -> None:
        extensions = client.ApiextensionsV1Api(self.api())
        names = []
        for path in paths:
            for document in yaml.safe_load_all(path.read_text()):
                if document and document.get("kind") == "CustomResourceDefinition":
                    extensions.create_custom_resource_definition(document)
                    names.append(document["metadata"]["name"])
        deadline = time.monotonic() + timeout
        for name in names:
            while True:
                crd = extensions.read_custom_resource_definition(name)
                conditions = {c.type: c.status for c in (crd.status.conditions or [])}
                if conditions.get("Established") == "True":
                    break
                if time.monotonic() > deadline:
                    raise RuntimeError(f"CRD {name} not established in {timeout} s")
                time.sleep(0.2)

    def stop(self) -> None:
        for name in reversed(list(self.processes)):
            process = self.processes[name]
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
                try:
                    process.wait(timeout=15)
                except subprocess.TimeoutExpired:
                    process.kill()
                    process.wait(timeout=5)


@contextmanager
def running_control_plane(workdir: Path, **options: Any) -> Iterator[ControlPlane]:
    binaries = control_plane_binaries()
    if binaries is None:
        raise RuntimeError("control plane binaries are not built: run scripts/build-control-plane.sh")
    plane = ControlPlane(binaries, workdir)
    try:
        yield plane.start(**options)
    finally:
        plane.stop()


def ca_bundle(plane_or_ca: CertificateAuthority) -> str:
    return base64.b64encode(plane_or_ca.pem).decode()


def go_available() -> bool:
    return shutil.which("go") is not None
