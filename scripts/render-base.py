#!/usr/bin/env python3
"""Render manifests/base (the kustomize base) from the Helm chart, so the two cannot drift: one file per template,
helm's own bookkeeping labels left out. `--check` only compares and exits 1 naming the files that differ.

Usage: scripts/render-base.py [--check] [--helm PATH]   (helm: scripts/build-helm.sh builds it)
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
CHART = REPO / "manifests" / "chart" / "koord-recommender"
BASE = REPO / "manifests" / "base"
VALUES = CHART / "ci" / "kustomize-base-values.yaml"
#: chart template -> base file (the names the overlays and docs know).
FILES = {
    "serviceaccounts.yaml": "serviceaccount.yaml",
    "rbac.yaml": "rbac.yaml",
    "store.yaml": "model-store.yaml",
    "deployment.yaml": "deployment.yaml",
    "pdb.yaml": "pdb.yaml",
    "service.yaml": "service.yaml",
    "networkpolicy.yaml": "networkpolicy.yaml",
    "sync.yaml": "sync.yaml",
    "train.yaml": "train-cronjob.yaml",
    "webhook.yaml": "webhook.yaml",
    "live.yaml": "live.yaml",
}
#: Labels only Helm's release bookkeeping needs.
HELM_ONLY = ("app.kubernetes.io/managed-by: Helm", "helm.sh/chart: ")
HEADER = (
    "# Generated from the Helm chart (manifests/chart/koord-recommender) by scripts/render-base.py with\n"
    "# ci/kustomize-base-values.yaml: edit the chart and re-run the script, not this file.\n"
)


def rendered(helm: str) -> dict[str, str]:
    """The base files' text as the chart renders them."""
    out = subprocess.run(
        [
            helm,
            "template",
            "koord-recommender",
            str(CHART),
            "--namespace",
            "koord-recommender",
            "--values",
            str(VALUES),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    if out.returncode != 0:
        sys.exit(f"helm template failed: {out.stderr.strip()}")
    files: dict[str, list[str]] = {}
    for document in out.stdout.split("---\n"):
        lines = document.strip("\n").splitlines()
        if not lines or not lines[0].startswith("# Source: "):
            continue
        template = lines[0].rsplit("/", 1)[-1]
        if template not in FILES:
            sys.exit(f"the chart renders {template}, which has no file in manifests/base: add it to FILES")
        body = [line for line in lines[1:] if not line.strip().startswith(HELM_ONLY)]
        files.setdefault(FILES[template], []).append("\n".join(body) + "\n")
    return {name: HEADER + "---\n".join(parts) for name, parts in files.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="compare only; exit 1 naming the files that differ")
    parser.add_argument("--helm", default="helm", help="the helm binary [default: helm on PATH]")
    args = parser.parse_args()
    wanted = rendered(args.helm)
    stale = sorted(name for name in {*FILES.values()} if (BASE / name).exists() and name not in wanted)
    differ = sorted(
        name for name, text in wanted.items() if not (BASE / name).exists() or (BASE / name).read_text() != text
    )
    if args.check:
        if differ or stale:
            sys.exit(
                f"manifests/base is out of step with the chart ({', '.join(differ + stale)}): run scripts/render-base.py"
            )
        return
    for name in differ:
        (BASE / name).write_text(wanted[name])
        print(f"wrote manifests/base/{name}", file=sys.stderr)
    for name in stale:
        (BASE / name).unlink()
        print(f"removed manifests/base/{name} (the chart renders nothing there with these values)", file=sys.stderr)


if __name__ == "__main__":
    main()
