"""The `vpa` policy against VPA's own recommender code (v1.5.1 from the Go module proxy), OOM kills included."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

from tests.conftest import BUNDLED, REPO

pytestmark = pytest.mark.e2e


@pytest.mark.skipif(shutil.which("go") is None, reason="needs Go to build VPA's recommender (make test installs it)")
def test_vpa_policy_equals_vpas_own_code_on_the_bundled_trace() -> None:
    done = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "vpa_crosscheck.py"), str(BUNDLED), "--ooms", "20"],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "google-2019: 4 of 4 workload containers equal on all six values; largest difference 0" in done.stdout, (
        done.stdout
    )
