"""The limit beside a new request, computed once (`recommender.limits`): on the quantity grid, never below the
request, and exactly what the webhook writes for a pod with the recorded request and limit (issue 39, item 2)."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import settings as hsettings
from hypothesis import strategies as st

from recommender.limits import PEAK, REQUEST, SCALED, Resource, on_grid, recommended_limit
from recommender.mutation import mutate
from recommender.optin import OptIn
from recommender.units import (
    GIB,
    MIB,
    cpu_cores_from_quantity,
    cpu_quantity,
    memory_bytes_from_quantity,
    memory_quantity,
)
from serving.settings import WebhookSettings
from tests.k8s import container, pod
from tests.recs import lookup_of, recommendation

QUANTITY = {"cpu": cpu_quantity, "memory": memory_quantity}
PARSE = {"cpu": cpu_cores_from_quantity, "memory": memory_bytes_from_quantity}


def test_a_limit_without_a_request_becomes_the_request() -> None:
    """Issue 39: job-113812204462 (CPU limit 3.6438, no request) said `limit: 3.64` while `/mutate` wrote 2899m."""
    assert recommended_limit("cpu", 2.8987030365059456, None, 3.6438, None) == (2.899, REQUEST)
    assert recommended_limit("cpu", 0.5, 1.0, 2.0, None) == (1.0, SCALED)
    assert recommended_limit("memory", 1 * GIB, None, 4 * GIB, 3 * GIB + 1) == (3 * GIB + MIB, PEAK["memory"])
    assert recommended_limit("cpu", 0.5, 0.0, 2.0, None) == (0.5, REQUEST)  # a zero request counts as the limit
    assert recommended_limit("cpu", 0.5, 1.0, None, None) == (None, None)  # we never add a limit
    assert recommended_limit("cpu", 0.5, 1.0, 0.0, None) == (None, None)


@pytest.mark.parametrize(
    ("resource", "value", "grid"),
    [("cpu", 2.8990000000000005, 2.899), ("cpu", 0.0015, 0.002), ("memory", 1.5 * MIB, 2 * MIB), ("memory", 10.2, 11)],
)
def test_the_grid_is_the_quantity_written(resource: Resource, value: float, grid: float) -> None:
    assert on_grid(resource, value) == grid
    assert PARSE[resource](QUANTITY[resource](value)) == grid


sizes = st.one_of(st.none(), st.floats(0, 64), st.sampled_from([0.0, 0.0015, 1e-4, 1e4]))


@given(
    resource=st.sampled_from(["cpu", "memory"]),
    target=st.floats(1e-4, 64),
    request=sizes,
    limit=sizes,
    floor=st.one_of(st.none(), st.floats(0, 64)),
)
@hsettings(max_examples=300, deadline=None)
def test_the_limit_is_on_the_grid_above_the_request_and_what_the_webhook_writes(
    resource: Resource, target: float, request: float | None, limit: float | None, floor: float | None
) -> None:
    scale = 1.0 if resource == "cpu" else GIB
    target, request, limit = (None if v is None else v * scale for v in (target, request, limit))  # type: ignore[assignment]
    floor = None if floor is None or resource == "cpu" else floor * scale
    found, rule = recommended_limit(resource, target, request, limit, floor)
    if found is None:
        assert rule is None and (limit is None or limit == 0)
        return
    assert found == on_grid(resource, found) >= on_grid(resource, target)
    assert floor is None or found >= floor
    shape: dict[str, Any] = {"limits": {resource: QUANTITY[resource](limit)}}
    if request is not None:
        shape["requests"] = {resource: QUANTITY[resource](request)}
    # The webhook reads the pod's quantities: the recommendation states the limit for those same values.
    read_request = None if request is None else PARSE[resource](QUANTITY[resource](request))
    stated, _ = recommended_limit(resource, target, read_request, PARSE[resource](QUANTITY[resource](limit)), floor)
    rec = recommendation("shop", "web", "main", 1.0, GIB)
    learned = getattr(rec, resource).model_copy(update={"target": target, "limit_floor": floor})
    rec = rec.model_copy(update={resource: learned})
    written = mutate(
        pod("deployment", "web", [container("main", shape)]),
        "shop",
        lookup_of(rec).get,
        WebhookSettings(),
        "v1",
        OptIn("Initial", "test"),
    ).pod["spec"]["containers"][0]["resources"]
    if stated is not None:
        assert PARSE[resource](written["limits"][resource]) == stated
        assert PARSE[resource](written["requests"][resource]) == on_grid(resource, target) <= stated
