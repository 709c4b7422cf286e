"""The streaming decoder of range answers (`MatrixDecoder`) against the naive one (`orjson.loads` of the whole body),
over arbitrary valid answers cut into arbitrary chunks; and its one-line errors for cut or broken answers."""

from __future__ import annotations

import json
import re
from typing import Any

import httpx
import numpy as np
import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipelines.prometheus import MatrixDecoder, PrometheusClient, decode_matrix
from pipelines.settings import PrometheusSettings
from recommender.errors import PrometheusError

QUERY = 'query_range rate(x{namespace="a"}[5m])'
label_names = st.from_regex(r"[a-zA-Z_][a-zA-Z0-9_]{0,8}", fullmatch=True)
#: Label values are any text: quotes, backslashes, brackets and the keys the decoder looks for included.
label_values = st.one_of(st.text(max_size=12), st.sampled_from(['"result":[', '"values":[[1,"2"]]', "]]", "{}", "\\"]))
#: Sample values as Prometheus writes them (strconv 'f', -1) and its special values.
numbers = st.one_of(
    st.floats(min_value=0, max_value=1e12, allow_nan=False).map(lambda v: np.format_float_positional(v, trim="-")),
    st.sampled_from(["NaN", "+Inf", "-Inf", "0", "1e-05"]),
)
times = st.one_of(st.integers(0, 2**31), st.integers(0, 2**31 * 1000).map(lambda ms: round(ms / 1000, 3)))


@st.composite
def answers(draw: st.DrawFn) -> tuple[bytes, list[bytes]]:
    """A valid answer, in any key order and layout, and a cut of it into chunks."""
    result = []
    for _ in range(draw(st.integers(0, 4))):
        labels = draw(st.dictionaries(label_names, label_values, max_size=4))
        pairs = [[t, v] for t, v in draw(st.lists(st.tuples(times, numbers), max_size=12))]
        item = {"metric": labels, "values": pairs}
        result.append(item if draw(st.booleans()) else dict(reversed(list(item.items()))))
    body: dict[str, Any] = {"status": "success", "data": {"resultType": "matrix", "result": result}}
    if draw(st.booleans()):
        body["warnings"] = ["results truncated"]
    if draw(st.booleans()):
        body = dict(reversed(list(body.items())))
    text = json.dumps(body, indent=draw(st.sampled_from([None, 1, 2])), ensure_ascii=draw(st.booleans())).encode()
    cuts = sorted(draw(st.sets(st.integers(0, len(text)), max_size=20)))
    return text, [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)])]


def naive(text: bytes) -> list[tuple[dict[str, str], list[float], list[float]]]:
    items = orjson.loads(text)["data"]["result"]
    return [(x["metric"], [float(t) for t, _ in x["values"]], [float(v) for _, v in x["values"]]) for x in items]


@given(answers())
@settings(max_examples=150, deadline=None)
def test_any_valid_answer_in_any_chunks_decodes_as_the_naive_decoder(answer: tuple[bytes, list[bytes]]) -> None:
    text, chunks = answer
    got = decode_matrix(chunks, QUERY)
    expected = naive(text)
    assert [series.labels for series in got] == [labels for labels, _, _ in expected]
    for series, (_, stamps, values) in zip(got, expected):
        assert series.times.dtype == np.float64 and np.array_equal(series.times, stamps)
        assert np.array_equal(series.values, values, equal_nan=True)


@given(answers(), st.data())
@settings(max_examples=100, deadline=None)
def test_a_cut_answer_is_a_one_line_error_naming_the_query(
    answer: tuple[bytes, list[bytes]], data: st.DataObject
) -> None:
    text, _ = answer
    cut = data.draw(st.integers(0, len(text) - 1))
    with pytest.raises(PrometheusError) as raised:
        decode_matrix([text[:cut]], QUERY)
    assert str(raised.value).startswith(QUERY + ":") and "\n" not in str(raised.value)


@pytest.mark.parametrize(
    ("body", "problem"),
    [
        (
            b'{"status":"success","data":{"resultType":"matrix","result":[{"metric":{},"values":[[1,"lots"]]}]}}',
            "not a [time",
        ),
        (
            b'{"status":"success","data":{"resultType":"matrix","result":[{"metric":{},"values":[[1,"2"],[3]]}]}}',
            "not a [time",
        ),
        (
            b'{"status":"success","data":{"resultType":"matrix","result":[{"metric":"x","values":[]}]}}',
            "not valid JSON",
        ),
        (b'{"status":"success","data":{"resultType":"matrix","result":[7]}}', "unexpected '7'"),
        (b'{"status":"error","errorType":"bad_data","error":"parse error"}', "unexpected answer"),
        (b'{"status":"success","data":{"resultType":"vector","result":[]}}', "expected a matrix"),
        (b"<html>gateway</html>", "not valid JSON"),
        (b"", "empty"),
    ],
)
def test_broken_answers_are_one_line_errors_naming_the_query(body: bytes, problem: str) -> None:
    with pytest.raises(PrometheusError, match=re.escape(problem)) as raised:
        decode_matrix([body], QUERY)
    assert str(raised.value).startswith(QUERY + ":") and "\n" not in str(raised.value)


def test_series_come_out_as_their_block_of_text_is_parsed() -> None:
    """Memory stays bounded: the decoder hands out series while the answer is still arriving."""
    pairs = ",".join(f'[{1000 + 300 * i},"{i}.5"]' for i in range(4032))
    item = '{"metric":{"pod":"p%d"},"values":[' + pairs + "]}"
    items = ",".join(item % i for i in range(200))
    text = ('{"status":"success","data":{"resultType":"matrix","result":[' + items + "]}}").encode()
    decoder = MatrixDecoder(QUERY)
    half = len(text) // 2
    early = decoder.feed(text[:half])
    assert 0 < len(early) < 200, "series are handed out before the answer is whole"
    rest = decoder.feed(text[half:]) + decoder.close()
    assert [s.labels["pod"] for s in early + rest] == [f"p{i}" for i in range(200)]
    assert all(s.times.size == 4032 and s.values[-1] == 4031.5 for s in early + rest)


def test_a_truncated_range_answer_over_http_names_the_query() -> None:
    body = b'{"status":"success","data":{"resultType":"matrix","result":[{"metric":{"pod":"a"},"values":[[1,"2"],[2'

    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, content=body)

    settings_ = PrometheusSettings(url="http://prom.test", retries=0)
    with PrometheusClient(settings_, transport=httpx.MockTransport(handler)) as prom:
        with pytest.raises(
            PrometheusError, match=r"^query_range up: the answer ended after \d+ bytes, inside its result"
        ):
            prom.query_range("up", 0, 600, 300)
    assert prom.stats.queries == 1 and prom.stats.bytes == len(body)
