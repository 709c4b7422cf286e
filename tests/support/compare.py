"""Comparing published recommendation sets of runs partitioned differently."""

from __future__ import annotations

import math
from typing import Any


def per_container(recommendation: dict[str, Any]) -> dict[str, Any]:
    """What does not depend on how the fleet is partitioned (the forecast candidates are chosen per partition)."""
    kept = {k: recommendation[k] for k in ("namespace", "workload", "container", "kind", "history", "current")}
    for resource in ("cpu", "memory"):
        kept[resource] = {k: recommendation[resource][k] for k in ("levels", "stale", "limit_floor")}
    return kept


def assert_close(got: Any, expected: Any, rel: float = 1e-9, where: str = "") -> None:
    """Equal JSON, numbers within `rel` of each other: sums over a node's pods added up in another order (by
    partition) differ in the last bits."""
    if isinstance(expected, dict):
        assert isinstance(got, dict) and got.keys() == expected.keys(), where
        for key in expected:
            assert_close(got[key], expected[key], rel, f"{where}.{key}")
    elif isinstance(expected, list):
        assert isinstance(got, list) and len(got) == len(expected), where
        for i, (a, b) in enumerate(zip(got, expected, strict=True)):
            assert_close(a, b, rel, f"{where}[{i}]")
    elif isinstance(expected, float) and not isinstance(got, bool) and isinstance(got, int | float):
        assert math.isclose(got, expected, rel_tol=rel, abs_tol=1e-12), (where, got, expected)
    else:
        assert got == expected, (where, got, expected)
