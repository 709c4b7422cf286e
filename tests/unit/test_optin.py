"""The webhook's opt-in as a pure function: sources and their precedence, VPA update modes and container policies,
HPA coexistence, dry-run, and what the mutation does with each decision."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import given
from hypothesis import settings as hsettings
from hypothesis import strategies as st

from recommender import optin
from recommender.mutation import APPLIED_ANNOTATION, WOULD_APPLY_ANNOTATION, mutate
from recommender.optin import MODE_KEY, OptIn
from recommender.settings import WebhookPolicy
from recommender.units import GIB, MIB
from serving.settings import WebhookSettings
from tests.k8s import RESOURCE_SHAPES, container, pod
from tests.recs import lookup_of, recommendation

NAME = "koord-recommender"
RECS = lookup_of(
    recommendation("shop", "web", "main", 0.5, 1 * GIB), recommendation("shop", "web", "sidecar", 0.1, 128 * MIB)
)


def web(labels: dict[str, str] | None = None, annotations: dict[str, str] | None = None) -> dict[str, Any]:
    shape = RESOURCE_SHAPES["both"]
    return pod(
        "deployment",
        "web",
        [container("main", shape), container("sidecar", shape)],
        labels=labels,
        annotations=annotations,
    )


def vpa(
    name: str = "web",
    recommenders: list[str] | None = None,
    update_mode: str | None = "Initial",
    kind: str = "Deployment",
    target: str = "web",
    **spec: Any,
) -> dict[str, Any]:
    found: dict[str, Any] = {"targetRef": {"apiVersion": "apps/v1", "kind": kind, "name": target}, **spec}
    if recommenders is not None:
        found["recommenders"] = [{"name": r} for r in recommenders]
    if update_mode is not None:
        found["updatePolicy"] = {"updateMode": update_mode}
    return {
        "apiVersion": "autoscaling.k8s.io/v1",
        "kind": "VerticalPodAutoscaler",
        "metadata": {"namespace": "shop", "name": name},
        "spec": found,
    }


def hpa(metrics: list[dict[str, Any]] | None, target: str = "web") -> dict[str, Any]:
    spec: dict[str, Any] = {
        "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": target},
        "minReplicas": 1,
        "maxReplicas": 5,
    }
    if metrics is not None:
        spec["metrics"] = metrics
    return {"metadata": {"namespace": "shop", "name": "web"}, "spec": spec}


def resource_metric(name: str, kind: str = "Resource") -> dict[str, Any]:
    field = "resource" if kind == "Resource" else "containerResource"
    return {"type": kind, field: {"name": name, "target": {"type": "Utilization", "averageUtilization": 70}}}


def decide(
    p: dict[str, Any],
    labels: dict[str, str] | None = None,
    vpas: list[Any] | None = None,
    hpas: list[Any] | None = None,
    default: optin.Mode = "Off",
) -> OptIn:
    return optin.decide(p, labels or {}, vpas or [], hpas or [], default, NAME)


def sized(
    p: dict[str, Any], decision: OptIn, webhook: WebhookSettings | None = None
) -> tuple[dict[str, Any], dict[str, Any], Any]:
    """(main's resources, sidecar's resources, the mutation) of `p` under `decision`."""
    result = mutate(p, "shop", RECS.get, webhook or WebhookSettings(), "v1", decision)
    containers = result.pod["spec"]["containers"]
    return containers[0]["resources"], containers[1]["resources"], result


def test_nothing_is_sized_by_default() -> None:
    decision = decide(web())
    assert (decision.mode, decision.source) == ("Off", "default (webhook.default_mode)")
    original = web()
    original["metadata"]["ownerReferences"][0]["uid"] = "fixed"
    result = mutate(original, "shop", RECS.get, WebhookSettings(), "v1", decision)
    assert result.pod == original and result.changes == [] and result.warnings == []


def test_precedence_pod_label_then_vpa_then_namespace_then_default() -> None:
    ours = vpa(recommenders=[NAME], update_mode="Off")
    assert (
        decide(web(labels={MODE_KEY: "Initial"}), {MODE_KEY: "Off"}, [ours]).source == f"pod label {MODE_KEY}=Initial"
    )
    assert decide(web(annotations={MODE_KEY: "auto"}), {}, [ours]).mode == "Auto"
    assert decide(web(), {MODE_KEY: "Initial"}, [ours]).source == "VerticalPodAutoscaler shop/web (updateMode Off)"
    assert decide(web(), {MODE_KEY: "Initial"}).source == f"namespace label {MODE_KEY}=Initial"
    assert decide(web(), default="Initial").mode == "Initial"


def test_vpa_update_modes_map_to_ours_and_the_unset_mode_is_auto() -> None:
    expected = {
        "Off": "Off",
        "Initial": "Initial",
        "Recreate": "Auto",
        "Auto": "Auto",
        "InPlaceOrRecreate": "Auto",
        None: "Auto",
    }
    for update_mode, mode in expected.items():
        assert decide(web(), vpas=[vpa(recommenders=[NAME], update_mode=update_mode)]).mode == mode
    odd = decide(web(), vpas=[vpa(recommenders=[NAME], update_mode="Sometimes")])
    assert odd.mode == "Off" and "unknown updateMode" in odd.warnings[0]


def test_a_vpa_of_another_recommender_or_none_leaves_the_pod_alone_whatever_the_labels() -> None:
    for recommenders in ([], ["default"], ["other"]):
        decision = decide(web(labels={MODE_KEY: "Initial"}), {MODE_KEY: "Initial"}, [vpa(recommenders=recommenders)])
        assert decision.mode == "Off" and "VerticalPodAutoscaler shop/web of" in decision.source
    # A VPA of another workload, or of another kind with the same name, does not count.
    assert decide(web(), {MODE_KEY: "Initial"}, [vpa(target="db"), vpa(kind="StatefulSet")]).mode == "Initial"


def test_bad_values_are_ignored_with_a_warning() -> None:
    decision = decide(web(labels={MODE_KEY: "yes"}), {MODE_KEY: "Initial"})
    assert decision.mode == "Initial" and "'yes' is not one of Off, Initial, Auto" in decision.warnings[0]
    decision = decide(web(), {MODE_KEY: "sometimes"})
    assert decision.mode == "Off" and "namespace label" in decision.warnings[0]
    bad = vpa(
        recommenders=[NAME],
        resourcePolicy={"containerPolicies": [{"containerName": "main", "minAllowed": {"cpu": "lots"}}]},
    )
    decision = decide(web(), vpas=[bad])
    assert (
        decision.mode == "Off"
        and "containerPolicies[0].minAllowed.cpu: 'lots' is not a quantity" in decision.warnings[0]
    )


def test_vpa_container_policies_bound_and_exclude_containers() -> None:
    policies = {
        "containerPolicies": [
            {
                "containerName": "main",
                "minAllowed": {"cpu": "800m"},
                "maxAllowed": {"memory": "768Mi"},
                "controlledValues": "RequestsOnly",
            },
            {"containerName": "*", "mode": "Off"},
        ]
    }
    main, sidecar, result = sized(web(), decide(web(), vpas=[vpa(recommenders=[NAME], resourcePolicy=policies)]))
    assert main == {"requests": {"cpu": "800m", "memory": "768Mi"}, "limits": {"cpu": "2", "memory": "4Gi"}}
    assert sidecar == RESOURCE_SHAPES["both"]
    record = json.loads(result.pod["metadata"]["annotations"][APPLIED_ANNOTATION])
    assert (
        record["mode"] == "Initial"
        and record["source"].startswith("VerticalPodAutoscaler shop/web")
        and record["version"] == "v1"
    )
    only_memory = {"containerPolicies": [{"containerName": "*", "controlledResources": ["memory"]}]}
    main, _, _ = sized(
        web(),
        decide(
            web(labels={MODE_KEY: "Initial"}),
            vpas=[vpa(recommenders=[NAME], update_mode="Off", resourcePolicy=only_memory)],
        ),
    )
    assert main["requests"] == {"cpu": "1", "memory": "1Gi"}  # the pod label sets the mode, the VPA still bounds it


def test_an_hpa_on_cpu_or_memory_keeps_that_resource_unchanged() -> None:
    assert optin.hpa_resources([hpa(None)], [("Deployment", "web")]) == {"cpu"}  # an HPA's default metric
    assert optin.hpa_resources([hpa([resource_metric("memory", "ContainerResource")])], [("Deployment", "web")]) == {
        "memory"
    }
    assert optin.hpa_resources([hpa([{"type": "External", "external": {}}])], [("Deployment", "web")]) == frozenset()
    assert optin.hpa_resources([hpa(None, target="db")], [("Deployment", "web")]) == frozenset()
    decision = decide(web(labels={MODE_KEY: "Initial"}), hpas=[hpa([resource_metric("cpu")])])
    main, _, result = sized(web(), decision)
    assert main["requests"] == {"cpu": "1", "memory": "1Gi"} and result.hpa_refused == ["cpu"]
    assert "HorizontalPodAutoscaler scales web on cpu; cpu left unchanged" in result.warnings[-1]


def test_dry_run_only_annotates_what_would_change() -> None:
    main, _, result = sized(web(), OptIn("Initial", "test"), WebhookSettings(dry_run=True))
    assert main == RESOURCE_SHAPES["both"]
    record = json.loads(result.pod["metadata"]["annotations"][WOULD_APPLY_ANNOTATION])
    assert (
        "main: cpu request 1 -> 500m" in record["changes"]
        and APPLIED_ANNOTATION not in result.pod["metadata"]["annotations"]
    )
    again = mutate(result.pod, "shop", RECS.get, WebhookSettings(dry_run=True), "v2", OptIn("Initial", "test"))
    assert again.pod == result.pod and again.changes == []


def test_former_policy_modes_are_still_read() -> None:
    assert WebhookPolicy.model_validate({"mode": "requests-only"}).controlled_values == "RequestsOnly"
    assert WebhookPolicy.model_validate({"mode": "requests-and-limits"}).controlled_values == "RequestsAndLimits"
    assert WebhookPolicy.model_validate({"mode": "off"}).controlled_resources == []
    try:
        WebhookPolicy.model_validate({"mode": "sometimes"})
    except ValueError as error:
        assert "now: controlled_values" in str(error)
    else:
        raise AssertionError("an unknown former mode was accepted")


values = st.one_of(st.none(), st.sampled_from(["Off", "Initial", "Auto", "initial", "bogus", ""]))
update_modes = st.one_of(st.none(), st.sampled_from(["Off", "Initial", "Recreate", "Auto", "InPlaceOrRecreate", "Odd"]))


@st.composite
def situations(draw: st.DrawFn) -> tuple[dict[str, Any], dict[str, str], list[Any], list[Any], optin.Mode]:
    labels = {MODE_KEY: v} if (v := draw(values)) is not None else {}
    annotations = {MODE_KEY: v} if (v := draw(values)) is not None else {}
    vpas = [
        vpa(
            name=f"v{i}",
            recommenders=draw(st.sampled_from([[], [NAME], ["other"], [NAME, "other"]])),
            update_mode=draw(update_modes),
            target=draw(st.sampled_from(["web", "db"])),
        )
        for i in range(draw(st.integers(0, 2)))
    ]
    hpas = [
        hpa(draw(st.sampled_from([None, [resource_metric("cpu")], [resource_metric("memory")], []])))
        for _ in range(draw(st.integers(0, 1)))
    ]
    namespace = {MODE_KEY: v} if (v := draw(values)) is not None else {}
    return web(labels, annotations), namespace, vpas, hpas, draw(st.sampled_from(optin.MODES))


@given(situations(), st.booleans())
@hsettings(max_examples=300, deadline=None)
def test_any_situation_follows_the_rules(situation: Any, dry_run: bool) -> None:
    p, namespace, vpas, hpas, default = situation
    decision = decide(p, namespace, vpas, hpas, default)
    labels, annotations = p["metadata"]["labels"], p["metadata"].get("annotations", {})
    targeting = [v for v in vpas if v["spec"]["targetRef"]["name"] == "web"]
    foreign = [v for v in targeting if NAME not in [r["name"] for r in v["spec"].get("recommenders", [])]]
    own_label = optin.parse_mode(labels.get(MODE_KEY)) or optin.parse_mode(annotations.get(MODE_KEY))
    if foreign:
        assert decision.mode == "Off"
    elif own_label is not None:
        assert decision.mode == own_label and decision.source.startswith("pod ")
    elif targeting:
        assert decision.source.startswith("VerticalPodAutoscaler")
    elif optin.parse_mode(namespace.get(MODE_KEY)) is not None:
        assert decision.source.startswith("namespace label")
    else:
        assert decision.mode == default
    main, sidecar, result = sized(p, decision, WebhookSettings(dry_run=dry_run))
    changed = main != RESOURCE_SHAPES["both"] or sidecar != RESOURCE_SHAPES["both"]
    # Resources change only when opted in, never in dry-run, never on a resource an HPA scales on.
    assert not changed or (decision.sizes and not dry_run)
    for name in decision.hpa_resources:
        assert main["requests"][name] == RESOURCE_SHAPES["both"]["requests"][name]  # type: ignore[index]
    annotations = result.pod["metadata"].get("annotations", {})
    assert (APPLIED_ANNOTATION in annotations) == changed
    if dry_run:
        assert set(annotations) - set(p["metadata"].get("annotations", {})) <= {WOULD_APPLY_ANNOTATION}
