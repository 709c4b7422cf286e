"""helm, built by scripts/build-helm.sh from the Go module proxy and cached outside git, and the chart rendered by it.

Also the published CRDs of cert-manager and the Prometheus Operator the same script fetches, for the kinds the chart
renders that the control plane's cache lacks.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "manifests" / "chart" / "koord-recommender"
HELM_VERSION = "3.21.4"
#: The values every render needs (the chart refuses to render without a Prometheus to train from).
PROMETHEUS = "http://prometheus-operated.monitoring.svc:9090"


def _cache() -> Path:
    return (
        Path(os.environ.get("KOORD_E2E_CACHE", Path.home() / ".cache" / "koord-recommender")) / f"helm-v{HELM_VERSION}"
    )


def helm_binary() -> Path:
    """The cached helm; skips when Go is missing here (it cannot be built), fails when it is just not built yet."""
    helm = _cache() / "bin" / "helm"
    if helm.exists():
        return helm
    if shutil.which("go") is None:
        pytest.skip("the chart tests need Go >= 1.26 to build helm: install Go, then `make test`")
    pytest.fail("helm is not built: run scripts/build-helm.sh (make test does)")


def extra_crd_files() -> list[Path]:
    """cert-manager's Certificate and Issuer CRDs and the Prometheus Operator's ServiceMonitor CRD, as published."""
    return sorted((_cache() / "crds").glob("*.yaml"))


def helm(*args: str, timeout: float = 120, home: Path | None = None) -> subprocess.CompletedProcess[str]:
    """Run the cached helm with `args`, bounded in time; with `home`, its config, cache and data (release
    bookkeeping of repositories, plugins) stay there instead of the user's."""
    env = dict(os.environ)
    if home is not None:
        env.update({f"HELM_{part}_HOME": str(home / part.lower()) for part in ("CONFIG", "CACHE", "DATA")})
    return subprocess.run(
        [str(helm_binary()), *args], capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL, env=env
    )


def nested(values: dict[str, Any]) -> dict[str, Any]:
    """Dotted keys ({"webhook.mode": "Initial"}) as the nested values document helm reads."""
    tree: dict[str, Any] = {}
    for key, value in values.items():
        *parents, leaf = key.split(".")
        node = tree
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = value
    return tree


def values_args(*value_files: Path, values: dict[str, Any] | None = None) -> list[str]:
    """--values flags: the files, then `values` (dotted keys, typed as given) with the Prometheus URL the chart needs."""
    args = [flag for path in value_files for flag in ("--values", str(path))]
    with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False) as handle:
        yaml.safe_dump(nested({"prometheus.url": PROMETHEUS, **(values or {})}), handle)
    return [*args, "--values", handle.name]


def render(
    *value_files: Path,
    values: dict[str, Any] | None = None,
    release: str = "koord-recommender",
    namespace: str = "koord-recommender",
) -> list[dict[str, Any]]:
    """`helm template` of the chart: the objects it renders, in order."""
    rendered = helm(
        "template", release, str(CHART), "--namespace", namespace, *values_args(*value_files, values=values)
    )
    assert rendered.returncode == 0, rendered.stderr
    return [d for d in yaml.safe_load_all(rendered.stdout) if d]
