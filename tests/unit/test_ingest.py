"""The tidy usage reader: every format, and a clear error with file, line and problem for each kind of bad row."""

from __future__ import annotations

import gzip
import string
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pipelines.ingest import (
    MAX_CELL_CHARACTERS,
    SampleBounds,
    iter_usage_batches,
    quarantine,
    read_oom_events,
    read_usage,
)
from pipelines.settings import IngestSettings
from recommender.errors import InputFileError
from tests.conftest import make_usage

#: The run's clock of these tests: samples up to 10 minutes after it are accepted.
NOW = 1_760_000_000
BOUNDS = SampleBounds.at(IngestSettings(), NOW)
HEADER = "timestamp,namespace,workload,pod,container,cpu_cores,memory_bytes"


def write(path: Path, text: str) -> Path:
    if path.suffix == ".gz":
        with gzip.open(path, "wt", encoding="utf-8") as handle:
            handle.write(text)
    else:
        path.write_text(text, encoding="utf-8")
    return path


@pytest.mark.parametrize("suffix", [".csv", ".csv.gz", ".parquet"])
def test_round_trip_every_format(tmp_path: Path, suffix: str) -> None:
    frame = make_usage(workloads=2, pods=2, days=0.5)
    path = tmp_path / f"usage{suffix}"
    if suffix == ".parquet":
        frame.to_parquet(path, index=False)
    else:
        frame.to_csv(path, index=False)
    read = read_usage(path, BOUNDS)
    assert len(read) == len(frame)
    np.testing.assert_allclose(read["cpu_cores"].to_numpy(), frame["cpu_cores"].to_numpy())
    assert read["timestamp"].dtype == np.int64
    assert read["cpu_request_cores"].isna().all()  # optional column absent -> missing


def test_missing_values_are_accepted(tmp_path: Path) -> None:
    path = write(tmp_path / "u.csv", HEADER + "\n1,ns,w,p,c,,\n2,ns,w,p,c,0.5,\n")
    read = read_usage(path, BOUNDS)
    assert read["cpu_cores"].isna().sum() == 1 and read["memory_bytes"].isna().all()


@pytest.mark.parametrize("suffix", [".csv", ".parquet"])
def test_empty_node_and_priority_class_are_missing(tmp_path: Path, suffix: str) -> None:
    """The optional name columns may be empty (a pod not yet placed, one without a PriorityClass): missing values,
    as an empty cell of a value column is; a required name still may not be."""
    body = "1,ns,w,p,c,1,1,n1,\n2,ns,w,p,c,1,1,,koord-batch\n3,ns,w,p,c,1,1, ,\n"
    text = HEADER + ",node,priority_class\n" + body
    path = write(tmp_path / "u.csv", text)
    if suffix == ".parquet":
        frame = pd.read_csv(path, keep_default_na=False, dtype=str)
        frame = frame.astype({"timestamp": np.int64, "cpu_cores": float, "memory_bytes": float})
        path = tmp_path / "u.parquet"
        frame.to_parquet(path, index=False)
    read = read_usage(path, BOUNDS)
    assert read["node"].isna().tolist() == [False, True, True]
    assert read["priority_class"].isna().tolist() == [True, False, True]
    assert read["node"].iloc[0] == "n1" and read["priority_class"].iloc[1] == "koord-batch"
    with pytest.raises(InputFileError, match="'pod' is empty"):
        read_usage(write(tmp_path / "v.csv", HEADER + "\n1,ns,w, ,c,1,1\n"), BOUNDS)


def test_unsorted_rows_come_back_sorted(tmp_path: Path) -> None:
    path = write(tmp_path / "u.csv", HEADER + "\n5,ns,w,p,c,1,1\n1,ns,w,p,c,1,1\n3,ns,a,p,c,1,1\n")
    assert list(read_usage(path, BOUNDS)["timestamp"]) == [3, 1, 5]


@pytest.mark.parametrize(
    ("body", "line", "message"),
    [
        ("1,ns,w,p,c,abc,1\n", 2, "'abc' is not a number"),
        ("1,ns,w,p,c,1,1\n2,ns,w,p,c,-0.5,1\n", 3, "negative cpu_cores"),
        ("1,ns,w,p,c,1,1\n1,ns,w,p,c,2,2\n", 3, "duplicate sample"),
        ("1,ns,w,p,c,1,1\n2,ns,w,p,c,1\n", 3, "has 6 fields, the header has 7"),
        ("1,ns,,p,c,1,1\n", 2, "'workload' is empty"),
        ("1.5,ns,w,p,c,1,1\n", 2, "not a whole number"),
        ("1,ns,w,p,c,1,inf\n", 2, "not a finite number"),
        ("-7,ns,w,p,c,1,1\n", 2, "negative"),
        ("1,ns,w,p,c,1,1\n2,ns,w,p,c,1,1\nnope,ns,w,p,c,1,1\n", 4, "not a whole number"),
    ],
)
@pytest.mark.parametrize("suffix", [".csv", ".csv.gz"])
def test_bad_rows_name_file_line_and_problem(tmp_path: Path, body: str, line: int, message: str, suffix: str) -> None:
    path = write(tmp_path / f"u{suffix}", HEADER + "\n" + body)
    with pytest.raises(InputFileError) as caught:
        read_usage(path, BOUNDS)
    assert caught.value.line == line
    assert message in str(caught.value)
    assert str(path) in str(caught.value)


def test_missing_column_and_empty_and_absent_files(tmp_path: Path) -> None:
    with pytest.raises(InputFileError, match=r"missing required column.*memory_bytes"):
        read_usage(
            write(tmp_path / "a.csv", "timestamp,namespace,workload,pod,container,cpu_cores\n1,n,w,p,c,1\n"), BOUNDS
        )
    with pytest.raises(InputFileError, match="is empty"):
        read_usage(write(tmp_path / "b.csv", ""), BOUNDS)
    with pytest.raises(InputFileError, match="no such file"):
        read_usage(tmp_path / "nope.csv", BOUNDS)
    (tmp_path / "c.csv.gz").write_bytes(b"not gzip")
    with pytest.raises(InputFileError, match="cannot be read"):
        read_usage(tmp_path / "c.csv.gz", BOUNDS)


def test_parquet_errors_name_the_row(tmp_path: Path) -> None:
    frame = make_usage(workloads=1, pods=1, days=0.1)
    frame.loc[frame.index[3], "memory_bytes"] = -1.0
    path = tmp_path / "u.parquet"
    frame.to_parquet(path, index=False)
    with pytest.raises(InputFileError, match="row 4: negative memory_bytes"):
        read_usage(path, BOUNDS)
    frame["cpu_cores"] = frame["cpu_cores"].astype(str)
    frame.to_parquet(path, index=False)
    with pytest.raises(InputFileError, match="'cpu_cores' must be numeric"):
        read_usage(path, BOUNDS)


def test_parquet_categorical_names_read_as_strings(tmp_path: Path) -> None:
    """A frame whose names pandas holds as categoricals is written dictionary-encoded: read as the plain one."""
    frame = make_usage(workloads=2, pods=2, days=0.2)
    plain, coded = tmp_path / "plain.parquet", tmp_path / "coded.parquet"
    frame.to_parquet(plain, index=False)
    names = ["namespace", "workload", "pod", "container"]
    frame.astype(dict.fromkeys(names, "category")).to_parquet(coded, index=False)
    read = read_usage(coded, BOUNDS)
    pd.testing.assert_frame_equal(read, read_usage(plain, BOUNDS))
    frame.astype({"pod": "category"}).assign(pod=lambda f: f["pod"].cat.codes).to_parquet(coded, index=False)
    with pytest.raises(InputFileError, match="'pod' must hold strings"):
        read_usage(coded, BOUNDS)


def test_oom_events(tmp_path: Path) -> None:
    path = write(tmp_path / "oom.csv", "timestamp,namespace,workload,pod,container\n10,ns,w,p,c\n")
    events = read_oom_events(path, BOUNDS)
    assert len(events) == 1 and events["memory_bytes"].isna().all()


names = st.text(alphabet=string.ascii_letters + string.digits + "-._ \"',", min_size=1, max_size=12).filter(
    lambda s: s.strip() == s and s.strip()
)
rows = st.lists(
    st.tuples(
        st.integers(0, NOW),
        names,
        names,
        st.one_of(st.none(), st.floats(0, 2e3, allow_nan=False)),
        st.one_of(st.none(), st.floats(0, 1e13, allow_nan=False)),
    ),
    min_size=1,
    max_size=30,
    unique_by=lambda r: (r[0], r[1], r[2]),
)


@given(rows)
@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_any_valid_file_reads_back_exactly(
    tmp_path: Path, data: list[tuple[int, str, str, float | None, float | None]]
) -> None:
    frame = pd.DataFrame(
        [(t, ns, w, w + "-0", "main", cpu, mem) for t, ns, w, cpu, mem in data],
        columns=HEADER.split(","),
    )
    path = tmp_path / "prop.csv"
    frame.to_csv(path, index=False)
    read = read_usage(path, BOUNDS).sort_values(["namespace", "workload", "timestamp"]).reset_index(drop=True)
    expected = frame.sort_values(["namespace", "workload", "timestamp"]).reset_index(drop=True)
    assert list(read["namespace"]) == list(expected["namespace"])
    assert list(read["workload"]) == list(expected["workload"])
    np.testing.assert_array_equal(read["timestamp"].to_numpy(), expected["timestamp"].to_numpy())
    np.testing.assert_allclose(read["cpu_cores"].to_numpy(dtype=float), expected["cpu_cores"].to_numpy(dtype=float))


@given(
    st.integers(1, 20),
    st.sampled_from(["x", "1e", "--1", "0x10", "1,5"]),
    st.sampled_from(["cpu_cores", "memory_bytes"]),
)
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_a_bad_cell_is_reported_at_its_line(tmp_path: Path, n_rows: int, bad: str, column: str) -> None:
    lines = [f"{i},ns,w,p,c,1,1" for i in range(n_rows)]
    position = n_rows // 2
    fields = lines[position].split(",")
    fields[HEADER.split(",").index(column)] = f'"{bad}"' if "," in bad else bad
    lines[position] = ",".join(fields)
    path = write(tmp_path / "bad.csv", HEADER + "\n" + "\n".join(lines) + "\n")
    with pytest.raises(InputFileError) as caught:
        read_usage(path, BOUNDS)
    assert caught.value.line == position + 2
    assert caught.value.column == column


# -- physical bounds (issue 13) -------------------------------------------------------------------------------------

FULL_HEADER = HEADER + ",cpu_limit_cores,memory_request_bytes,cpu_throttled_fraction"


@pytest.mark.parametrize(
    ("row", "column", "message"),
    [
        ("1,ns,w,p,c,1e300,1,,,", "cpu_cores", "cpu_cores 1e+300 is above the ceiling of 2048 cores per container"),
        ("1,ns,w,p,c,1,4e13,,,", "memory_bytes", "memory_bytes 4e+13 is above the ceiling of 3.51844e+13 bytes"),
        ("1,ns,w,p,c,1,1,5000,,", "cpu_limit_cores", "cpu_limit_cores 5000 is above the ceiling"),
        ("1,ns,w,p,c,1,1,,-3,", "memory_request_bytes", "negative memory_request_bytes"),
        ("1,ns,w,p,c,1,1,,,1.5", "cpu_throttled_fraction", "is above the ceiling of 1"),
        ("1,ns,w,p,c,NaN,1,,,", "cpu_cores", "not a finite number (a missing value is an empty cell"),
        ("1,ns,w,p,c,1,-inf,,,", "memory_bytes", "not a finite number"),
        (
            "1700000000000,ns,w,p,c,1,1,,,",
            "timestamp",
            "timestamp 1700000000000 is in the future, after 2025-10-09T09:03:20+00:00",
        ),
        (f"{NOW + 601},ns,w,p,c,1,1,,,", "timestamp", "is in the future"),
        ("99999999999999999999,ns,w,p,c,1,1,,,", "timestamp", "does not fit in 64 bits"),
    ],
)
@pytest.mark.parametrize("suffix", [".csv", ".csv.gz"])
def test_impossible_values_are_refused_naming_line_and_column(
    tmp_path: Path, row: str, column: str, message: str, suffix: str
) -> None:
    good = "".join(f"{NOW - 300 * i},ns,w,p,c,1,1,,,\n" for i in range(1, 4))
    path = write(tmp_path / f"u{suffix}", FULL_HEADER + "\n" + good + row + "\n")
    with pytest.raises(InputFileError) as caught:
        read_usage(path, BOUNDS)
    assert (caught.value.line, caught.value.column) == (5, column)
    assert message in str(caught.value)
    assert str(caught.value).startswith(f"{path}, line 5, column '{column}': ")


def test_the_future_tolerance_is_a_setting(tmp_path: Path) -> None:
    path = write(tmp_path / "u.csv", HEADER + f"\n{NOW + 600},ns,w,p,c,1,1\n")
    assert len(read_usage(path, BOUNDS)) == 1
    strict = SampleBounds.at(IngestSettings(future_tolerance_seconds=0), NOW)
    with pytest.raises(InputFileError, match="line 2, column 'timestamp': timestamp 1760000600 is in the future"):
        read_usage(path, strict)
    tight = SampleBounds.at(IngestSettings(max_cpu_cores=0.5), NOW)
    with pytest.raises(InputFileError, match=r"cpu_cores 1 is above the ceiling of 0\.5 cores"):
        read_usage(path, tight)


def test_parquet_and_oom_files_are_bounded_too(tmp_path: Path) -> None:
    frame = make_usage(workloads=1, pods=1, days=0.1)
    frame.loc[frame.index[5], "cpu_cores"] = 1e300
    frame.to_parquet(tmp_path / "u.parquet", index=False)
    with pytest.raises(InputFileError, match="row 6: cpu_cores 1e\\+300 is above the ceiling"):
        read_usage(tmp_path / "u.parquet", BOUNDS)
    frame = make_usage(workloads=1, pods=1, days=0.1)
    frame.loc[frame.index[2], "timestamp"] = 1_700_000_000_000
    frame.to_parquet(tmp_path / "ms.parquet", index=False)
    with pytest.raises(InputFileError, match="row 3: timestamp 1700000000000 is in the future"):
        read_usage(tmp_path / "ms.parquet", BOUNDS)
    oom = write(tmp_path / "oom.csv", "timestamp,namespace,workload,pod,container,memory_bytes\n10,ns,w,p,c,1e20\n")
    with pytest.raises(InputFileError, match="line 2, column 'memory_bytes': memory_bytes 1e\\+20 is above"):
        read_oom_events(oom, BOUNDS)


# -- malformed files: one line naming file, line and column (issue 13) ------------------------------------------------


def rows_text(n: int, start: int = 1_700_000_000) -> str:
    return "".join(f"{start + 300 * i},ns,w,p,c,0.5,1000000\n" for i in range(n))


def read_both_ways(path: Path) -> InputFileError:
    """The error of the whole-file reader, checked to be the streaming reader's (distributed training's) too."""
    with pytest.raises(InputFileError) as whole:
        read_usage(path, BOUNDS)
    with pytest.raises(InputFileError) as streamed:
        list(iter_usage_batches(path, BOUNDS, batch_bytes=1 << 12))
    assert str(streamed.value) == str(whole.value)
    return whole.value


def test_a_truncated_gzip_file_names_the_line_it_breaks_at(tmp_path: Path) -> None:
    data = gzip.compress((HEADER + "\n" + rows_text(3000)).encode())
    path = tmp_path / "cut.csv.gz"
    path.write_bytes(data[: len(data) // 2])
    error = read_both_ways(path)
    assert error.line is not None and 2 < error.line < 3002
    assert f"{path}, line {error.line}: cannot be read: Compressed file ended before the end-of-stream marker" in str(
        error
    )


def test_an_unterminated_quote_names_its_line_and_column(tmp_path: Path) -> None:
    long = write(
        tmp_path / "long.csv", HEADER + "\n" + rows_text(3) + '1,"ns,w,p,c,1,1\n' + rows_text(20000, 1_710_000_000)
    )
    error = read_both_ways(long)
    assert (error.line, error.column) == (5, "namespace")
    assert "unterminated quote: the quoted field opened here never closes" in str(error)
    short = write(
        tmp_path / "short.csv", HEADER + "\n" + rows_text(3) + '1,ns,"w,p,c,1,1\n' + rows_text(2, 1_710_000_000)
    )
    error = read_both_ways(short)
    assert (error.line, error.column) == (5, "workload")
    assert "a quote opened on this line runs to line 7 (unterminated quote?)" in str(error)


def test_bytes_that_are_not_utf8_name_line_and_column(tmp_path: Path) -> None:
    path = tmp_path / "latin1.csv"
    path.write_bytes((HEADER + "\n" + rows_text(2) + "5,ns,w\xe9,p,c,1,1\n").encode("latin-1"))
    error = read_both_ways(path)
    assert (error.line, error.column) == (4, "workload")
    assert "byte 0xe9 at character 7 is not UTF-8" in str(error)
    header = tmp_path / "header.csv"
    header.write_bytes(b"timestamp,namespace,w\xffrkload\n")
    with pytest.raises(InputFileError, match=r"header\.csv, line 1: byte 0xff at character 22 is not UTF-8"):
        read_usage(header, BOUNDS)


def test_a_cell_longer_than_the_csv_module_takes_is_one_error_quoting_only_a_prefix(tmp_path: Path) -> None:
    """Issue 39: such a cell was a traceback of the csv module when the file had another problem, and a bad cell
    was echoed whole."""
    long = "w" * (MAX_CELL_CHARACTERS + 1)
    bad = "1700000300,ns,w,p,c,lots,1\n"  # makes the fast parser give up: the slow re-read meets the long cell
    cases = {
        "valid-otherwise.csv": (rows_text(2) + f"1,ns,{long},p,c,1,1\n", 4, "workload"),
        "then-bad.csv": (f"1,ns,{long},p,c,1,1\n" + bad, 2, "workload"),
        "quoted.csv": (f'1,"ns,{long}",w,p,c,1,1\n' + bad, 2, "namespace"),
        "number.csv": (f"1,ns,w,p,c,{long},1\n", 2, "cpu_cores"),
    }
    for name, (body, line, column) in cases.items():
        error = read_both_ways(write(tmp_path / name, HEADER + "\n" + body))
        assert (error.line, error.column) == (line, column), name
        assert str(error).endswith("the cell is longer than 131,072 characters, the most a cell may hold")
    with pytest.raises(InputFileError, match=r"header\.csv, line 1: the cell is longer than 131,072 characters"):
        read_usage(write(tmp_path / "header.csv", HEADER + "," + long + "\n" + rows_text(1)), BOUNDS)
    latin1 = tmp_path / "latin1.csv"
    latin1.write_bytes((HEADER + "\n" + f"1,ns,{long},p\xe9,c,1,1\n").encode("latin-1"))
    error = read_both_ways(latin1)
    assert (error.line, error.column) == (2, "pod") and "byte 0xe9" in str(error)
    shorter = write(tmp_path / "shorter.csv", HEADER + "\n" + f"1,ns,w,p,c,{'x' * 100_000},1\n")
    error = read_both_ways(shorter)
    assert str(error).endswith(f"{'x' * 40!r}... (100,000 characters) is not a number"), str(error)[:300]


def test_a_header_without_a_newline_is_an_empty_file(tmp_path: Path) -> None:
    path = write(tmp_path / "header-only.csv", HEADER)
    assert read_usage(path, BOUNDS).empty
    assert list(iter_usage_batches(path, BOUNDS)) == []


def test_quoted_line_breaks_in_names_keep_line_numbers_right(tmp_path: Path) -> None:
    body = '1,ns,w,p,c,1,1\n2,"n\ns",w,p,c,1,1\n3,ns,"w\n\nx",p,c,1,1\n4,ns,w,p,c,-1,1\n'
    error = read_both_ways(write(tmp_path / "u.csv", HEADER + "\n" + body))
    assert (error.line, error.column) == (8, "cpu_cores")
    duplicated = write(tmp_path / "d.csv", HEADER + "\n" + body.replace("-1", "1").replace("4,ns,w,p,c", "1,ns,w,p,c"))
    with pytest.raises(InputFileError, match=r"d\.csv, line 8: duplicate sample .* first seen at line 2"):
        read_usage(duplicated, BOUNDS)
    many = write(
        tmp_path / "many.csv", HEADER + "\n" + '1,"n\ns",w,p,c,1,1\n' * 1 + rows_text(400) + "5,ns,w,p,c,-1,1\n"
    )
    error = read_both_ways(many)
    assert error.line == 404


@given(st.binary(max_size=300), st.sampled_from([".csv", ".csv.gz", "truncated.csv.gz"]))
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_any_bytes_read_or_fail_with_an_input_error(tmp_path: Path, body: bytes, kind: str) -> None:
    data = (HEADER + "\n").encode() + body
    if kind.endswith(".gz"):
        data = gzip.compress(data)
        if kind.startswith("truncated"):
            data = data[: len(data) - 1 - len(body) % 9]
    path = tmp_path / ("fuzz" + kind.removeprefix("truncated"))
    path.write_bytes(data)
    try:
        read_usage(path, BOUNDS)
    except InputFileError as error:
        assert str(error).startswith(str(path)) and "\n" not in str(error)


IMPOSSIBLE = [(c, v) for c in ("cpu_cores", "memory_bytes") for v in ("-1", "inf", "nan", "1e300")] + [
    ("timestamp", v) for v in ("-1", "1.5", "1700000000000", "18446744073709551616")
]


@given(st.integers(1, 15), st.sampled_from(IMPOSSIBLE))
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_an_impossible_cell_is_reported_at_its_line_and_column(
    tmp_path: Path, n_rows: int, cell: tuple[str, str]
) -> None:
    column, bad = cell
    lines = [f"{1_700_000_000 + i},ns,w,p,c,1,1" for i in range(n_rows)]
    position = n_rows // 2
    fields = lines[position].split(",")
    fields[HEADER.split(",").index(column)] = bad
    lines[position] = ",".join(fields)
    path = write(tmp_path / "bad.csv", HEADER + "\n" + "\n".join(lines) + "\n")
    with pytest.raises(InputFileError) as caught:
        read_usage(path, BOUNDS)
    assert (caught.value.line, caught.value.column) == (position + 2, column)


samples = st.lists(
    st.tuples(
        st.sampled_from(["a", "b", "c\x1b[0m"]),
        st.one_of(st.floats(allow_nan=True), st.floats(0, 100)),
        st.one_of(st.floats(allow_nan=True), st.floats(0, 1e12)),
        st.integers(0, NOW + 10_000),
    ),
    min_size=1,
    max_size=40,
)


@given(samples)
@settings(max_examples=150, deadline=None)
def test_quarantine_keeps_only_possible_containers_and_names_every_other(
    data: list[tuple[str, float, float, int]],
) -> None:
    usage = pd.DataFrame(
        [(t, "ns", w, f"{w}-p", "main", cpu, memory) for w, cpu, memory, t in data], columns=HEADER.split(",")
    )
    kept, quarantined = quarantine(usage, BOUNDS)
    assert set(kept["workload"]).isdisjoint(name.split("/")[1] for name in quarantined)
    assert set(kept["workload"]) | {name.split("/")[1] for name in quarantined} == set(usage["workload"])
    for column, ceiling in (("cpu_cores", BOUNDS.max_cpu_cores), ("memory_bytes", BOUNDS.max_memory_bytes)):
        values = kept[column].dropna()
        assert ((values >= 0) & (values <= ceiling)).all()
    assert (kept["timestamp"] <= BOUNDS.latest_timestamp).all()
    assert len(kept) == int(usage["workload"].isin(kept["workload"]).sum())
