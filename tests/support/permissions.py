"""The Kubernetes permissions of the chart's service accounts, three ways, as comparable sets of (verb, resource):
the table in docs/security.md (for given values), the roles a render of the chart binds, and what the API server
says an account may do (SelfSubjectRulesReview, as `kubectl auth can-i --list`).

A resource is written as kubectl writes it: `resource.group`, a subresource after a slash
(`verticalpodautoscalers.autoscaling.k8s.io/status`), resource names in brackets (`leases.coordination.k8s.io
[name]`); a non-resource URL as itself.
"""

from __future__ import annotations

import re
from collections import defaultdict
from pathlib import Path
from typing import Any

import yaml

from tests.support.helm import CHART, REPO

DOC = REPO / "docs" / "security.md"
Grants = dict[str, set[tuple[str, str]]]


def resource_key(group: str, resource: str, names: list[str] | None = None) -> str:
    base, _, sub = resource.partition("/")
    key = base + (f".{group}" if group else "") + (f"/{sub}" if sub else "")
    return key + (f" [{','.join(sorted(names))}]" if names else "")


def rule_grants(rule: dict[str, Any]) -> set[tuple[str, str]]:
    """(verb, resource) pairs one RBAC rule, or one rule of a SelfSubjectRulesReview's status, grants."""
    verbs = rule.get("verbs") or []
    if rule.get("nonResourceURLs"):
        return {(v, url) for v in verbs for url in rule["nonResourceURLs"]}
    return {
        (v, resource_key(group, resource, rule.get("resourceNames")))
        for group in rule.get("apiGroups") or []
        for resource in rule.get("resources") or []
        for v in verbs
    }


def chart_defaults() -> dict[str, Any]:
    values: dict[str, Any] = yaml.safe_load((CHART / "values.yaml").read_text())
    return values


def value_at(values: dict[str, Any], dotted: str) -> Any:
    node: Any = values
    for part in dotted.split("."):
        node = node[part]
    return node


def documented(values: dict[str, Any], doc: Path = DOC) -> Grants:
    """The table of docs/security.md: per service account, what its rows grant under `values` (the chart's
    defaults with dotted overrides)."""
    merged = chart_defaults()
    for dotted, value in values.items():
        *parents, leaf = dotted.split(".")
        node = merged
        for part in parents:
            node = node[part]
        node[leaf] = value
    text = doc.read_text()
    table = text[text.index("| service account | when |") :].split("\n\n")[0].splitlines()[2:]
    grants: Grants = defaultdict(set)
    for line in table:
        account, when, verbs, resource, _why = (cell.strip() for cell in line.strip("|").split("|"))
        name = re.match(r"`([^`]+)`", account)
        assert name is not None, line
        conditions = re.findall(r"`([^`]+)`", when)
        assert conditions, f"a row without a condition: {line}"
        if all(value_at(merged, c) is True for c in conditions):
            grants[name.group(1)] |= {(v.strip(), resource.strip("`")) for v in verbs.split(",")}
    return dict(grants)


def rendered(objects: list[dict[str, Any]]) -> Grants:
    """Per service account, what the (Cluster)Roles bound to it in a render grant."""
    roles = {(o["kind"], o["metadata"]["name"]): o.get("rules") or [] for o in objects if o["kind"].endswith("Role")}
    grants: Grants = defaultdict(set)
    for binding in (o for o in objects if o["kind"].endswith("RoleBinding")):
        rules = roles[(binding["roleRef"]["kind"], binding["roleRef"]["name"])]
        for subject in binding["subjects"]:
            if subject["kind"] == "ServiceAccount":
                grants[subject["name"]] |= {g for rule in rules for g in rule_grants(rule)}
    return dict(grants)
