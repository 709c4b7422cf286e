"""End-to-end tests against a real Kubernetes control plane built from source (scripts/build-control-plane.sh)."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.control_plane import ControlPlane, control_plane_binaries, crd_files

pytestmark = pytest.mark.e2e


def _binaries() -> Path:
    binaries = control_plane_binaries()
    if binaries is None:
        if shutil.which("go") is None:
            pytest.skip(
                "the end-to-end tests need Go >= 1.24 to build the Kubernetes control plane: install Go, then `make test`"
            )
        pytest.fail("the control plane is not built: run scripts/build-control-plane.sh (make test does)")
    return binaries


@pytest.fixture(scope="module")
def plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    """etcd + kube-apiserver with the VPA and Koordinator CRDs installed."""
    control = ControlPlane(_binaries(), tmp_path_factory.mktemp("control-plane"))
    try:
        control.start()
        control.install_crds(crd_files())
        yield control
    finally:
        control.stop()
