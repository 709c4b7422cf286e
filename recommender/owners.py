"""Which workload a pod belongs to, from what the pod itself carries (no API calls, so admission stays fast).

Recommendations are keyed by the workload's controller name (the Deployment, StatefulSet, DaemonSet, CronJob or
Job). A pod only names its direct owner, so the name is derived the way the controllers build it: a ReplicaSet is
`<deployment>-<pod-template-hash>`, a CronJob's Job is `<cronjob>-<scheduled minute>`. A bare pod falls back to
its generateName stem, then its name.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

TEMPLATE_HASH_LABEL = "pod-template-hash"
_CRONJOB_SUFFIX = re.compile(r"^(?P<cronjob>.+)-\d{8,}$")


def workload_refs(pod: Mapping[str, Any]) -> list[tuple[str, str]]:
    """(kind, name) of the controllers that own this pod, the top one first: what a VerticalPodAutoscaler's
    targetRef or a HorizontalPodAutoscaler's scaleTargetRef names (a ReplicaSet's Deployment, a Job's CronJob)."""
    metadata = pod.get("metadata") or {}
    owners = [o for o in metadata.get("ownerReferences") or [] if isinstance(o, Mapping)]
    owner = next((o for o in owners if o.get("controller")), owners[0] if owners else None)
    if owner is None or not isinstance(owner.get("name"), str):
        return []
    kind, name = str(owner.get("kind") or ""), owner["name"]
    refs: list[tuple[str, str]] = []
    if kind == "ReplicaSet":
        template_hash = (metadata.get("labels") or {}).get(TEMPLATE_HASH_LABEL)
        if template_hash and name.endswith("-" + template_hash):
            refs.append(("Deployment", name[: -len(template_hash) - 1]))
    elif kind == "Job":
        match = _CRONJOB_SUFFIX.match(name)
        if match:
            refs.append(("CronJob", match["cronjob"]))
    refs.append((kind, name))
    return refs


def workload_candidates(pod: Mapping[str, Any]) -> list[str]:
    """Workload names this pod may be recorded under, most specific first (callers take the first one known)."""
    metadata = pod.get("metadata") or {}
    names = [name for _, name in workload_refs(pod)]
    generate_name = metadata.get("generateName")
    if isinstance(generate_name, str) and generate_name.rstrip("-"):
        names.append(generate_name.rstrip("-"))
    if isinstance(metadata.get("name"), str) and metadata["name"]:
        names.append(metadata["name"])
    return list(dict.fromkeys(names))
