"""The webhook's mutation as a pure function: VPA sizing, policies, colocation, validation fallback."""

from __future__ import annotations

import json
from typing import Any

import jsonpatch
from hypothesis import given
from hypothesis import settings as hsettings
from hypothesis import strategies as st

from recommender import koordinator as k
from recommender.mutation import APPLIED_ANNOTATION, mutate, relevant_fields
from recommender.optin import OptIn
from recommender.settings import ColocationProfile, WebhookPolicy
from recommender.units import GIB, MIB, cpu_cores_from_quantity, memory_bytes_from_quantity
from serving.settings import WebhookSettings
from tests.k8s import RESOURCE_SHAPES, container, pod
from tests.recs import lookup_of, recommendation

ON = OptIn("Initial", "test")

RECS = lookup_of(
    recommendation("shop", "web", "main", 0.5, 1 * GIB),
    recommendation("shop", "web", "istio-proxy", 0.1, 128 * MIB),
    recommendation("shop", "web", "migrate", 0.2, 256 * MIB),
)
BATCH = ColocationProfile(
    name="batch", namespaces=["shop"], selector={"tier": "batch"}, qos_class="BE", priority_class_name="koord-batch"
)


def run(
    shape: str, webhook: WebhookSettings | None = None, labels: dict[str, str] | None = None, **kwargs: Any
) -> tuple[dict[str, Any], Any]:
    original = pod("deployment", "web", [container("main", RESOURCE_SHAPES[shape])], labels=labels, **kwargs)
    result = mutate(original, "shop", RECS.get, webhook or WebhookSettings(), "v1", ON)
    # The diff must apply to the original and give the mutated pod, and the original must be untouched.
    patch = jsonpatch.make_patch(original, result.pod)
    assert jsonpatch.apply_patch(original, patch) == result.pod
    return result.pod, result


def resources(found: dict[str, Any], index: int = 0) -> dict[str, Any]:
    value: dict[str, Any] = found["spec"]["containers"][index].get("resources", {})
    return value


def test_requests_get_the_target_and_limits_scale_proportionally() -> None:
    found, result = run("both")
    assert resources(found) == {"requests": {"cpu": "500m", "memory": "1Gi"}, "limits": {"cpu": "1", "memory": "2Gi"}}
    record = json.loads(found["metadata"]["annotations"][APPLIED_ANNOTATION])
    assert (
        record["workload"] == "web" and record["version"] == "v1" and "main: cpu request 1 -> 500m" in record["changes"]
    )
    factors = json.loads(found["metadata"]["annotations"][k.SCALING_FACTORS_ANNOTATION])
    assert factors == {"cpu": 40, "memory": 40}  # long-term 0.8 x target over the limit (2 x target)
    assert result.warnings == []


def test_every_resources_shape() -> None:
    assert resources(run("absent")[0]) == {"requests": {"cpu": "500m", "memory": "1Gi"}}
    assert resources(run("empty")[0]) == {"requests": {"cpu": "500m", "memory": "1Gi"}}
    assert resources(run("requests-only")[0]) == {"requests": {"cpu": "500m", "memory": "1Gi"}}
    # Only limits: the API server defaulted requests to the limits, so the limit follows the request (ratio 1).
    assert resources(run("limits-only")[0]) == {
        "requests": {"cpu": "500m", "memory": "1Gi"},
        "limits": {"cpu": "500m", "memory": "1Gi"},
    }
    assert resources(run("cpu-only")[0]) == {"requests": {"cpu": "500m", "memory": "1Gi"}, "limits": {"cpu": "2"}}
    extra = resources(run("with-extra-resource")[0])
    assert extra == {
        "requests": {"cpu": "500m", "nvidia.com/gpu": "1", "memory": "1Gi"},
        "limits": {"nvidia.com/gpu": "1"},
    }


def test_init_and_sidecar_containers_are_sized_and_unknown_containers_untouched() -> None:
    original = pod(
        "deployment",
        "web",
        [container("main", None), container("unknown", {"requests": {"cpu": "3"}})],
        init_containers=[
            container("migrate", None),
            container("istio-proxy", {"limits": {"cpu": "1"}}, restartPolicy="Always"),
        ],
    )
    found = mutate(original, "shop", RECS.get, WebhookSettings(), "v1", ON).pod
    assert found["spec"]["initContainers"][0]["resources"] == {"requests": {"cpu": "200m", "memory": "256Mi"}}
    assert found["spec"]["initContainers"][1]["resources"] == {
        "requests": {"cpu": "100m", "memory": "128Mi"},
        "limits": {"cpu": "100m"},
    }
    assert found["spec"]["containers"][1] == original["spec"]["containers"][1]


def test_policies_modes_lines_bounds_and_controlled_resources() -> None:
    off = WebhookSettings(policies=[WebhookPolicy(namespace="shop", workload="w*", mode="off")])
    found, result = run("both", off)
    assert resources(found)["requests"] == {"cpu": "1", "memory": "2Gi"} and result.changes == []
    requests_only = WebhookSettings(
        policies=[WebhookPolicy(mode="requests-only", line="upper_bound", controlled_resources=["cpu"])]
    )
    found, _ = run("both", requests_only)
    assert resources(found) == {"requests": {"cpu": "750m", "memory": "2Gi"}, "limits": {"cpu": "2", "memory": "4Gi"}}
    capped = WebhookSettings(policies=[WebhookPolicy(mode="requests-only", min_cpu_cores=3.0)])
    found, _ = run("both", capped)
    assert resources(found)["requests"]["cpu"] == "2"  # never above the limit: the API server would reject it
    bounded = WebhookSettings(policies=[WebhookPolicy(max_cpu_cores=0.3, min_memory_bytes=3 * GIB)])
    assert resources(run("requests-only", bounded)[0])["requests"] == {"cpu": "300m", "memory": "3Gi"}
    zero = pod("deployment", "web", [container("main", {"requests": {"cpu": "0"}, "limits": {"cpu": "300m"}})])
    found = mutate(zero, "shop", RECS.get, WebhookSettings(), "v1", ON).pod
    # A zero request counts as the limit, as VPA reads it: the limit becomes the request, never below it.
    assert resources(found) == {"requests": {"cpu": "500m", "memory": "1Gi"}, "limits": {"cpu": "500m"}}
    other = WebhookSettings(policies=[WebhookPolicy(namespace="other", mode="off")])
    assert resources(run("requests-only", other)[0])["requests"]["cpu"] == "500m"


def test_unknown_workload_is_left_alone_with_a_warning() -> None:
    original = pod("statefulset", "db", [container("main", None)])
    result = mutate(original, "shop", RECS.get, WebhookSettings(), "v1", ON)
    assert result.pod == original and result.workload is None
    assert "no recommendation for workload ['db'] in shop" in result.warnings[0]


def test_batch_profile_sets_qos_priority_and_renames_resources() -> None:
    found, result = run("both", WebhookSettings(colocation_profiles=[BATCH]), labels={"tier": "batch"})
    assert found["metadata"]["labels"][k.QOS_LABEL] == "BE"
    assert (found["spec"]["priorityClassName"], found["spec"]["priority"]) == ("koord-batch", 5000)
    assert resources(found) == {
        "requests": {"kubernetes.io/batch-cpu": "500", "kubernetes.io/batch-memory": str(GIB)},
        "limits": {"kubernetes.io/batch-cpu": "1000", "kubernetes.io/batch-memory": str(2 * GIB)},
    }
    assert k.violations(found) == [] and result.warnings == []


def test_profile_that_koordinator_would_reject_is_dropped_but_sizing_kept() -> None:
    bad = ColocationProfile(name="bad", qos_class="BE", priority_class_name="koord-prod")
    found, result = run("both", WebhookSettings(colocation_profiles=[bad]))
    assert k.QOS_LABEL not in found["metadata"]["labels"] and "priorityClassName" not in found["spec"]
    assert resources(found)["requests"]["cpu"] == "500m"
    assert (
        "colocation skipped" in result.warnings[0] and "QoS BE cannot run as priority koord-prod" in result.warnings[0]
    )


def test_sizing_that_breaks_whole_cpus_of_an_lsr_pod_is_dropped() -> None:
    found, result = run("guaranteed", labels={k.QOS_LABEL: "LSR"}, annotations=None)
    assert found["spec"]["containers"][0]["resources"]["requests"]["cpu"] == "2"
    assert "not resized" in result.warnings[0]


def test_unknown_priority_class_in_a_profile_is_reported() -> None:
    odd = ColocationProfile(name="odd", priority_class_name="gold")
    _, result = run("both", WebhookSettings(colocation_profiles=[odd]))
    assert result.warnings == ["profile odd: unknown priority class gold"]


quantities = st.one_of(st.none(), st.sampled_from(["100m", "250m", "1", "1500m", "4"]))
memories = st.one_of(st.none(), st.sampled_from(["64Mi", "512Mi", "1Gi", "3Gi"]))


@st.composite
def any_resources(draw: st.DrawFn) -> dict[str, Any] | None:
    if draw(st.booleans()):
        return None
    found: dict[str, Any] = {}
    for part in ("requests", "limits"):
        values = {k: v for k, v in (("cpu", draw(quantities)), ("memory", draw(memories))) if v is not None}
        if values or draw(st.booleans()):
            found[part] = values
    # The API server rejects request > limit; keep only pods it would accept.
    for name in ("cpu", "memory"):
        request, limit = found.get("requests", {}).get(name), found.get("limits", {}).get(name)
        parse = cpu_cores_from_quantity if name == "cpu" else memory_bytes_from_quantity
        if request and limit and parse(request) > parse(limit):
            found["limits"][name] = request
    return found


@given(
    shapes=st.lists(any_resources(), min_size=1, max_size=3),
    mode=st.sampled_from(["off", "requests-only", "requests-and-limits"]),
    line=st.sampled_from(["target", "upper_bound", "long_term", "peak"]),
    batch=st.booleans(),
)
@hsettings(max_examples=150, deadline=None)
def test_any_pod_gets_a_valid_pod(shapes: list[dict[str, Any] | None], mode: str, line: str, batch: bool) -> None:
    names = ["main", "istio-proxy", "other"]
    original = pod(
        "deployment",
        "web",
        [container(names[i], shape) for i, shape in enumerate(shapes)],
        labels={"tier": "batch"} if batch else None,
    )
    webhook = WebhookSettings(policies=[WebhookPolicy(mode=mode, line=line)], colocation_profiles=[BATCH])  # type: ignore[arg-type]
    found = mutate(original, "shop", RECS.get, webhook, "v1", ON).pod
    assert jsonpatch.apply_patch(original, jsonpatch.make_patch(original, found)) == found
    # What the webhook sends: the diff of the projections, applied to the whole pod, gives the same pod.
    view = relevant_fields(original)
    assert (
        jsonpatch.apply_patch(
            original, jsonpatch.make_patch(view, mutate(view, "shop", RECS.get, webhook, "v1", ON).pod)
        )
        == found
    )
    assert k.violations(found) == []
    for one in found["spec"]["containers"]:
        res = one.get("resources") or {}
        for name, value in (res.get("requests") or {}).items():
            limit = (res.get("limits") or {}).get(name)
            if limit is not None and not name.startswith("nvidia"):
                parse = memory_bytes_from_quantity if "memory" in name else cpu_cores_from_quantity
                assert parse(value) <= parse(limit), (name, value, limit)


def test_patch_paths_escape_slashes_and_tildes_in_keys() -> None:
    original = pod(
        "deployment", "web", [container("main", None)], annotations={"a~b/c": "kept"}, labels={"tier": "batch"}
    )
    webhook = WebhookSettings(colocation_profiles=[BATCH.model_copy(update={"labels": {"team/x~y": "1"}})])
    view = relevant_fields(original)
    patch = jsonpatch.make_patch(view, mutate(view, "shop", RECS.get, webhook, "v1", ON).pod).patch
    paths = {op["path"] for op in patch}
    assert "/metadata/annotations/koord-recommender.io~1applied" in paths
    assert "/metadata/labels/team~1x~0y" in paths and "/metadata/labels/koordinator.sh~1qosClass" in paths
    assert "/spec/containers/0/resources" in paths  # the parent is added whole when it was absent
    patched = jsonpatch.apply_patch(original, patch)
    assert patched["metadata"]["annotations"]["a~b/c"] == "kept" and patched["metadata"]["labels"]["team/x~y"] == "1"


def test_a_pod_already_mutated_is_left_as_is() -> None:
    original = pod("deployment", "web", [container("main", RESOURCE_SHAPES["both"])], labels={"tier": "batch"})
    webhook = WebhookSettings(colocation_profiles=[BATCH])
    once = mutate(original, "shop", RECS.get, webhook, "v1", ON).pod
    again = mutate(once, "shop", RECS.get, webhook, "v2", ON)
    assert once != original and again.pod == once and again.changes == [] and again.warnings == []


def test_a_memory_limit_never_goes_below_the_observed_peak_floor() -> None:
    """VPA would scale a 4Gi limit with a 2Gi -> 256Mi request to 512Mi; the recommendation's floor (the observed peak
    + margin) keeps it at 900Mi, and the request itself still follows the recommendation."""
    rec = recommendation("shop", "web", "main", 0.5, 256 * MIB)
    assert rec.memory is not None
    floored = rec.model_copy(update={"memory": rec.memory.model_copy(update={"limit_floor": 900.0 * MIB})})
    original = pod("deployment", "web", [container("main", RESOURCE_SHAPES["both"])])
    found = mutate(original, "shop", lookup_of(floored).get, WebhookSettings(), "v1", ON).pod
    assert resources(found)["requests"]["memory"] == "256Mi"
    assert memory_bytes_from_quantity(resources(found)["limits"]["memory"]) == 900 * MIB


def test_a_stale_recommendation_is_not_applied_and_says_why() -> None:
    rec = recommendation("shop", "web", "main", 0.5, 1 * GIB)
    assert rec.cpu is not None and rec.memory is not None
    stale = rec.model_copy(
        update={
            "cpu": rec.cpu.model_copy(update={"stale": True}),
            "memory": rec.memory.model_copy(update={"stale": True}),
        }
    )
    original = pod("deployment", "web", [container("main", RESOURCE_SHAPES["both"])])
    result = mutate(original, "shop", lookup_of(stale).get, WebhookSettings(), "v1", ON)
    assert resources(result.pod) == RESOURCE_SHAPES["both"]
    assert any("stale" in warning for warning in result.warnings)


@st.composite
def off_grid_resources(draw: st.DrawFn) -> dict[str, Any]:
    """Limits anywhere, off the grid the webhook rounds to (a 1.5m CPU limit, 10^9 bytes of memory), and requests
    from 0 up to them, or none."""
    found: dict[str, Any] = {"requests": {}, "limits": {}}
    for name, unit, largest in (("cpu", "u", 64_000_000), ("memory", "", 2**40)):
        limit = draw(st.integers(1, largest))
        found["limits"][name] = f"{limit}{unit}"
        request = draw(st.one_of(st.none(), st.integers(0, limit)))
        if request is not None:
            found["requests"][name] = f"{request}{unit}"
    return found


@given(
    shape=off_grid_resources(),
    cpu=st.floats(0, 100),
    memory=st.floats(0, 2.0**41),
    controlled=st.sampled_from(["RequestsOnly", "RequestsAndLimits"]),
)
@hsettings(max_examples=300, deadline=None)
def test_rounding_never_puts_a_request_above_its_limit(
    shape: dict[str, Any], cpu: float, memory: float, controlled: str
) -> None:
    """Issue 39: a 0 request with a 1.5m limit was patched to a 2m request, which the API server rejects."""
    rec = recommendation("shop", "web", "main", cpu, memory)
    webhook = WebhookSettings(policies=[WebhookPolicy(controlled_values=controlled)])
    found = resources(
        mutate(pod("deployment", "web", [container("main", shape)]), "shop", lookup_of(rec).get, webhook, "v1", ON).pod
    )
    for name, parse in (("cpu", cpu_cores_from_quantity), ("memory", memory_bytes_from_quantity)):
        assert parse(found["requests"][name]) <= parse(found["limits"][name]), (name, found)


def test_a_request_rounded_past_an_off_grid_limit_is_the_limit() -> None:
    original = pod("deployment", "web", [container("main", {"requests": {"cpu": "0"}, "limits": {"cpu": "1500u"}})])
    requests_only = WebhookSettings(policies=[WebhookPolicy(controlled_values="RequestsOnly")])
    found = resources(mutate(original, "shop", RECS.get, requests_only, "v1", ON).pod)
    assert found["requests"]["cpu"] == "1500u" and found["limits"]["cpu"] == "1500u"
    # Limits scaled: a zero request counts as the limit (as VPA reads it), so the limit becomes the request.
    found = resources(mutate(original, "shop", RECS.get, WebhookSettings(), "v1", ON).pod)
    assert found["requests"]["cpu"] == found["limits"]["cpu"] == "500m"
