"""PromQL building: quoting and regex alternation are exact for any label value (property tests)."""

from __future__ import annotations

import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pipelines import promql

_UNESCAPE = {"\\": "\\", '"': '"', "n": "\n", "r": "\r", "t": "\t"}


def unquote(literal: str) -> str:
    """What Prometheus' lexer makes of a double-quoted string (the escapes we emit)."""
    assert literal[0] == literal[-1] == '"'
    out, i, body = [], 0, literal[1:-1]
    while i < len(body):
        if body[i] == "\\":
            out.append(_UNESCAPE[body[i + 1]])
            i += 2
        else:
            assert body[i] != '"', "an unescaped quote would end the string"
            out.append(body[i])
            i += 1
    return "".join(out)


@given(st.text())
def test_quote_round_trips_any_value(value: str) -> None:
    assert unquote(promql.quote(value)) == value


@given(st.lists(st.text(min_size=1, max_size=12), min_size=1, max_size=6), st.text(max_size=12))
def test_alternatives_match_exactly_the_values(values: list[str], other: str) -> None:
    pattern = unquote(promql.regex_alternatives(values))
    # Prometheus anchors regex matchers; Python's re agrees with RE2 on escaped literals and '|'.
    for value in values:
        assert re.fullmatch(pattern, value, flags=re.DOTALL)
    assert bool(re.fullmatch(pattern, other, flags=re.DOTALL)) == (other in values)


def test_selectors_and_names() -> None:
    query = promql.selector("kube_pod_owner", [promql.eq("namespace", 'a"b'), promql.ne("container", "")])
    assert query == 'kube_pod_owner{namespace="a\\"b",container!=""}'
    assert promql.by(["namespace", "pod"]) == "by (namespace,pod)"
    for bad in ("1metric", "a-b", "x{y}"):
        with pytest.raises(ValueError):
            promql.metric_name(bad)
    with pytest.raises(ValueError):
        promql.label_name("bad label")
    with pytest.raises(ValueError):
        promql.regex_alternatives([])
