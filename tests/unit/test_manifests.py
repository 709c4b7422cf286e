"""Every manifest we ship validates offline against the Kubernetes schemas of the release we test against."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from tests.support.control_plane import K8S_VERSION, crd_files

MANIFESTS = Path(__file__).resolve().parents[2] / "manifests"
#: Kinds from CRDs: validated against the CRD's own schema when the CRDs are fetched, else in the e2e dry run.
CRD_KINDS = {
    "VerticalPodAutoscaler",
    "Recommendation",
    "Certificate",
    "Issuer",
    "ServiceMonitor",
    "KubeSchedulerConfiguration",
}


def documents() -> list[tuple[str, dict[str, Any]]]:
    found = []
    for path in sorted(MANIFESTS.rglob("*.yaml")):
        if path.name == "kustomization.yaml" or MANIFESTS / "chart" in path.parents:
            continue  # the chart's templates are not YAML until rendered: tests/unit/test_chart.py
        for index, document in enumerate(yaml.safe_load_all(path.read_text())):
            if document:
                found.append((f"{path.relative_to(MANIFESTS)}#{index}", document))
    return found


@pytest.mark.parametrize(("where", "document"), documents(), ids=[w for w, _ in documents()])
def test_manifest_is_valid(where: str, document: dict[str, Any]) -> None:
    if document["kind"] in CRD_KINDS:
        pytest.skip(f"{document['kind']} comes from a CRD (checked by the e2e dry run where installed)")
    kubernetes_validate.validate(document, K8S_VERSION, strict=True)


def test_kustomizations_name_existing_files() -> None:
    for kustomization in MANIFESTS.rglob("kustomization.yaml"):
        spec = yaml.safe_load(kustomization.read_text())
        for resource in spec.get("resources", []):
            assert (kustomization.parent / resource).exists(), f"{kustomization}: {resource} is missing"


def test_vpa_example_matches_the_vpa_crd() -> None:
    files = [f for f in crd_files() if f.name.startswith("vpa")]
    if not files:
        pytest.skip("VPA CRD not fetched yet (scripts/build-control-plane.sh fetches it)")
    import jsonschema

    crds = [
        d
        for d in yaml.safe_load_all(files[0].read_text())
        if d and d["spec"]["names"]["kind"] == "VerticalPodAutoscaler"
    ]
    schema = next(v for v in crds[0]["spec"]["versions"] if v["name"] == "v1")["schema"]["openAPIV3Schema"]
    jsonschema.validate(yaml.safe_load((MANIFESTS / "examples" / "vpa.yaml").read_text()), schema)


def test_workloads_run_hardened() -> None:
    for where, document in documents():
        spec = document.get("spec", {})
        template = spec.get("template") or spec.get("jobTemplate", {}).get("spec", {}).get("template")
        if not template:
            continue
        pod = template["spec"]
        assert pod["securityContext"]["runAsNonRoot"] is True, where
        for container in pod["containers"]:
            context = container["securityContext"]
            assert context["readOnlyRootFilesystem"] is True and context["allowPrivilegeEscalation"] is False, where
            assert container["resources"]["requests"] and container["resources"]["limits"]["memory"], where
