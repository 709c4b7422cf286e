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

from pipelines.ingest import read_oom_events, read_usage
from recommender.errors import InputFileError
from tests.conftest import make_usage

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
    read = read_usage(path)
    assert len(read) == len(frame)
    np.testing.assert_allclose(read["cpu_cores"].to_numpy(), frame["cpu_cores"].to_numpy())
    assert read["timestamp"].dtype == np.int64
    assert read["cpu_request_cores"].isna().all()  # optional column absent -> missing


def test_missing_values_are_accepted(tmp_path: Path) -> None:
    path = write(tmp_path / "u.csv", HEADER + "\n1,ns,w,p,c,,\n2,ns,w,p,c,0.5,\n")
    read = read_usage(path)
    assert read["cpu_cores"].isna().sum() == 1 and read["memory_bytes"].isna().all()


def test_unsorted_rows_come_back_sorted(tmp_path: Path) -> None:
    path = write(tmp_path / "u.csv", HEADER + "\n5,ns,w,p,c,1,1\n1,ns,w,p,c,1,1\n3,ns,a,p,c,1,1\n")
    assert list(read_usage(path)["timestamp"]) == [3, 1, 5]


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
        read_usage(path)
    assert caught.value.line == line
    assert message in str(caught.value)
    assert str(path) in str(caught.value)


def test_missing_column_and_empty_and_absent_files(tmp_path: Path) -> None:
    with pytest.raises(InputFileError, match="missing required column.*memory_bytes"):
        read_usage(write(tmp_path / "a.csv", "timestamp,namespace,workload,pod,container,cpu_cores\n1,n,w,p,c,1\n"))
    with pytest.raises(InputFileError, match="is empty"):
        read_usage(write(tmp_path / "b.csv", ""))
    with pytest.raises(InputFileError, match="no such file"):
        read_usage(tmp_path / "nope.csv")
    (tmp_path / "c.csv.gz").write_bytes(b"not gzip")
    with pytest.raises(InputFileError, match="cannot be read"):
        read_usage(tmp_path / "c.csv.gz")


def test_parquet_errors_name_the_row(tmp_path: Path) -> None:
    frame = make_usage(workloads=1, pods=1, days=0.1)
    frame.loc[frame.index[3], "memory_bytes"] = -1.0
    path = tmp_path / "u.parquet"
    frame.to_parquet(path, index=False)
    with pytest.raises(InputFileError, match="row 4: negative memory_bytes"):
        read_usage(path)
    frame["cpu_cores"] = frame["cpu_cores"].astype(str)
    frame.to_parquet(path, index=False)
    with pytest.raises(InputFileError, match="'cpu_cores' must be numeric"):
        read_usage(path)


def test_oom_events(tmp_path: Path) -> None:
    path = write(tmp_path / "oom.csv", "timestamp,namespace,workload,pod,container\n10,ns,w,p,c\n")
    events = read_oom_events(path)
    assert len(events) == 1 and events["memory_bytes"].isna().all()


names = st.text(alphabet=string.ascii_letters + string.digits + "-._ \"',", min_size=1, max_size=12).filter(
    lambda s: s.strip() == s and s.strip()
)
rows = st.lists(
    st.tuples(
        st.integers(0, 2**40),
        names,
        names,
        st.one_of(st.none(), st.floats(0, 1e4, allow_nan=False)),
        st.one_of(st.none(), st.floats(0, 1e13, allow_nan=False)),
    ),
    min_size=1,
    max_size=30,
    unique_by=lambda r: (r[0], r[1], r[2]),
)


@given(rows)
@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_any_valid_file_reads_back_exactly(tmp_path: Path, data: list[tuple[int, str, str, float | None, float | None]]) -> None:
    frame = pd.DataFrame(
        [(t, ns, w, w + "-0", "main", cpu, mem) for t, ns, w, cpu, mem in data],
        columns=HEADER.split(","),
    )
    path = tmp_path / "prop.csv"
    frame.to_csv(path, index=False)
    read = read_usage(path).sort_values(["namespace", "workload", "timestamp"]).reset_index(drop=True)
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
        read_usage(path)
    assert caught.value.line == position + 2
    assert caught.value.column == column
