"""Reading tidy usage files (CSV, gzipped CSV, Parquet) with validation that names the file, line and problem.

The fast path parses with pyarrow into typed columns. When that fails, or a typed check finds a bad value, the
error points at the 1-based line of the file (the header is line 1; for Parquet, the 1-based row). Reading never
writes anything, so a bad file cannot damage what earlier runs produced.
"""

from __future__ import annotations

import csv
import gzip
import io
import math
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq

from recommender.errors import InputFileError

Kind = Literal["id", "timestamp", "value"]


@dataclass(frozen=True)
class Column:
    name: str
    kind: Kind
    required: bool


#: The tidy usage format of shared/data/README.md.
USAGE_SCHEMA: tuple[Column, ...] = (
    Column("timestamp", "timestamp", True),
    Column("namespace", "id", True),
    Column("workload", "id", True),
    Column("pod", "id", True),
    Column("container", "id", True),
    Column("cpu_cores", "value", True),
    Column("memory_bytes", "value", True),
    Column("cpu_limit_cores", "value", False),
    Column("memory_limit_bytes", "value", False),
    Column("cpu_request_cores", "value", False),
    Column("memory_request_bytes", "value", False),
    Column("cpu_throttled_fraction", "value", False),
    Column("node", "id", False),
    Column("priority_class", "id", False),
)

#: OOM kills: which pod container was killed when, and (optionally) its memory at the kill.
OOM_SCHEMA: tuple[Column, ...] = (
    Column("timestamp", "timestamp", True),
    Column("namespace", "id", True),
    Column("workload", "id", True),
    Column("pod", "id", True),
    Column("container", "id", True),
    Column("memory_bytes", "value", False),
)

_SAMPLE_KEY = ["namespace", "workload", "pod", "container", "timestamp"]


def read_usage(path: Path | str) -> pd.DataFrame:
    """Read and validate a tidy usage file; rows come back sorted as the format says."""
    frame = read_table(Path(path), USAGE_SCHEMA)
    _check_unique(Path(path), frame, _SAMPLE_KEY)
    return frame.sort_values(_SAMPLE_KEY, kind="stable").reset_index(drop=True)


def read_oom_events(path: Path | str) -> pd.DataFrame:
    """Read and validate an OOM events file."""
    return read_table(Path(path), OOM_SCHEMA)


def read_table(path: Path, schema: tuple[Column, ...]) -> pd.DataFrame:
    """Read a CSV, CSV.gz or Parquet file against a schema; raise InputFileError on the first problem."""
    parquet, wanted = _columns_present(path, schema)
    try:
        table = _read_parquet(path, wanted) if parquet else _read_csv(path, wanted)
    except pa.ArrowException:
        if parquet:
            raise InputFileError(path, "has a column of the wrong type (see the schema in the README)") from None
        raise _locate_csv_problem(path, wanted) from None
    return _typed_frame(path, table, schema, wanted, first_row=0, parquet=parquet)


def iter_usage_batches(path: Path | str, batch_bytes: int = 64 << 20) -> Iterator[pd.DataFrame]:
    """A usage file streamed as validated frames (about `batch_bytes` of CSV or one Parquet row group each), with
    errors naming the file's line as `read_usage` does. Memory stays bounded whatever the file's size: this is how
    distributed training splits a file into partitions (a gzip CSV cannot be seeked, so it is read through once).
    Duplicate samples are not checked here (that needs a whole workload); `read_usage` of a partition does."""
    path = Path(path)
    parquet, wanted = _columns_present(path, USAGE_SCHEMA)
    row = 0
    try:
        if parquet:
            handle = pq.ParquetFile(path)
            batches: Iterator[pa.RecordBatch] = handle.iter_batches(columns=[c.name for c in wanted])
        else:
            batches = iter(pacsv.open_csv(path, read_options=pacsv.ReadOptions(block_size=batch_bytes), convert_options=_csv_options(wanted)))
        for batch in batches:
            table = pa.Table.from_batches([batch])
            frame = _typed_frame(path, _cast_parquet(path, table, wanted) if parquet else table, USAGE_SCHEMA, wanted, row, parquet)
            row += len(frame)
            yield frame
    except pa.ArrowException:
        if parquet:
            raise InputFileError(path, "has a column of the wrong type (see the schema in the README)") from None
        raise _locate_csv_problem(path, wanted) from None


def _columns_present(path: Path, schema: tuple[Column, ...]) -> tuple[bool, list[Column]]:
    """Whether the file is Parquet, and the schema's columns its header has (after checking the header)."""
    if not path.is_file():
        raise InputFileError(path, "no such file")
    parquet = path.suffix.lower() in {".parquet", ".pq"}
    try:
        header = _parquet_columns(path) if parquet else _csv_header(path)
    except (OSError, EOFError, UnicodeDecodeError, pa.ArrowException) as error:
        raise InputFileError(path, f"cannot be read: {error}") from error
    _check_header(path, header, schema, line=None if parquet else 1)
    return parquet, [c for c in schema if c.name in header]


def _typed_frame(path: Path, table: pa.Table, schema: tuple[Column, ...], wanted: list[Column], first_row: int, parquet: bool) -> pd.DataFrame:
    """The checked frame of rows starting at 0-based data row `first_row`, with every value column of the schema."""
    frame: pd.DataFrame = table.to_pandas()
    _check_values(path, frame, wanted, first_line=first_row + (1 if parquet else 2), unit="row" if parquet else "line")
    frame["timestamp"] = frame["timestamp"].astype(np.int64)
    for column in schema:
        if column.name not in frame.columns and column.kind == "value":
            frame[column.name] = np.nan
    return frame


def _parquet_columns(path: Path) -> list[str]:
    return list(pq.read_schema(path).names)


def _open_text(path: Path) -> io.TextIOBase:
    if path.suffix.lower() == ".gz":
        return io.TextIOWrapper(gzip.open(path, "rb"), encoding="utf-8", newline="")
    return open(path, encoding="utf-8", newline="")


def _csv_header(path: Path) -> list[str]:
    with _open_text(path) as handle:
        first = next(csv.reader(handle), None)
    if first is None:
        raise InputFileError(path, "is empty: expected a header row", line=1)
    return [name.strip() for name in first]


def _check_header(path: Path, header: list[str], schema: tuple[Column, ...], line: int | None) -> None:
    missing = [c.name for c in schema if c.required and c.name not in header]
    if missing:
        raise InputFileError(path, f"missing required column(s) {', '.join(missing)}; header has {', '.join(header)}", line=line)
    seen: set[str] = set()
    for name in header:
        if name in seen:
            raise InputFileError(path, f"column '{name}' appears twice in the header", line=line)
        seen.add(name)


def _arrow_type(column: Column) -> pa.DataType:
    return {"id": pa.string(), "timestamp": pa.int64(), "value": pa.float64()}[column.kind]


def _read_csv(path: Path, columns: list[Column]) -> pa.Table:
    return pacsv.read_csv(path, convert_options=_csv_options(columns))


def _csv_options(columns: list[Column]) -> pacsv.ConvertOptions:
    return pacsv.ConvertOptions(
        column_types={c.name: _arrow_type(c) for c in columns},
        include_columns=[c.name for c in columns],
        strings_can_be_null=False,
        null_values=[""],
        quoted_strings_can_be_null=False,
    )


def _read_parquet(path: Path, columns: list[Column]) -> pa.Table:
    return _cast_parquet(path, pq.read_table(path, columns=[c.name for c in columns]), columns)


def _cast_parquet(path: Path, table: pa.Table, columns: list[Column]) -> pa.Table:
    """The table in the schema's types, after checking each column holds what its kind allows."""
    casts = []
    for column in columns:
        field = table.schema.field(column.name)
        target = _arrow_type(column)
        if column.kind == "id" and not pa.types.is_string(field.type) and not pa.types.is_large_string(field.type):
            raise InputFileError(path, f"column '{column.name}' must hold strings, holds {field.type}")
        if column.kind != "id" and not (pa.types.is_integer(field.type) or pa.types.is_floating(field.type)):
            raise InputFileError(path, f"column '{column.name}' must be numeric, holds {field.type}")
        casts.append(target if column.kind != "timestamp" or pa.types.is_integer(field.type) else pa.float64())
    return table.cast(pa.schema([(c.name, t) for c, t in zip(columns, casts)]))


def _rows(path: Path) -> Iterator[tuple[int, list[str]]]:
    """(line number, fields) of each data row; counts physical lines so quoted newlines keep numbers right."""
    with _open_text(path) as handle:
        reader = csv.reader(handle)
        next(reader, None)
        for fields in reader:
            yield reader.line_num, fields


def _locate_csv_problem(path: Path, columns: list[Column]) -> InputFileError:
    """Slow re-read that finds the first line the fast parser choked on and says what is wrong with it."""
    header = _csv_header(path)
    position = {name: i for i, name in enumerate(header)}
    try:
        for line, fields in _rows(path):
            if len(fields) != len(header):
                return InputFileError(path, f"has {len(fields)} fields, the header has {len(header)}", line=line)
            for column in columns:
                cell = fields[position[column.name]].strip()
                problem = _cell_problem(column, cell)
                if problem:
                    return InputFileError(path, problem, line=line, column=column.name)
    except (csv.Error, UnicodeDecodeError, EOFError, OSError) as error:
        return InputFileError(path, f"is not valid CSV: {error}")
    return InputFileError(path, "could not be parsed as CSV")


def _cell_problem(column: Column, cell: str) -> str | None:
    if column.kind == "id":
        return f"'{column.name}' is empty" if not cell else None
    if not cell:
        return f"'{column.name}' is empty" if column.kind == "timestamp" else None
    if column.kind == "timestamp":
        try:
            int(cell)
        except ValueError:
            return f"timestamp {cell!r} is not a whole number of Unix seconds"
        return None
    try:
        value = float(cell)
    except ValueError:
        return f"{cell!r} is not a number"
    return None if math.isfinite(value) or math.isnan(value) else f"{cell!r} is not a finite number"


def _check_values(path: Path, frame: pd.DataFrame, columns: list[Column], first_line: int, unit: str) -> None:
    """Typed checks over whole columns; report the first offending row by its line number."""

    def fail(mask: np.ndarray, column: str, problem: str) -> None:
        row = int(np.argmax(mask))
        where = first_line + row
        if unit == "line":
            raise InputFileError(path, problem.format(value=frame[column].iloc[row]), line=where, column=column)
        raise InputFileError(path, f"row {where}: " + problem.format(value=frame[column].iloc[row]), column=column)

    for column in columns:
        series = frame[column.name]
        if column.kind == "id":
            bad = series.isna().to_numpy() | (series.astype(str).str.strip() == "").to_numpy()
            if bad.any():
                fail(bad, column.name, f"'{column.name}' is empty")
            continue
        values = series.to_numpy(dtype=np.float64, na_value=np.nan)
        if column.kind == "timestamp":
            bad = np.isnan(values) | (values != np.floor(values))
            if bad.any():
                fail(bad, column.name, "timestamp {value!r} is not a whole number of Unix seconds")
            if (values < 0).any():
                fail(values < 0, column.name, "timestamp {value} is negative")
            continue
        if np.isinf(values).any():
            fail(np.isinf(values), column.name, "{value} is not a finite number")
        negative = values < 0
        if negative.any():
            fail(negative, column.name, f"negative {column.name} {{value}}: usage, limits and requests cannot be below 0")


def _check_unique(path: Path, frame: pd.DataFrame, key: list[str]) -> None:
    duplicated = frame.duplicated(subset=key, keep="first").to_numpy()
    if duplicated.any():
        row = int(np.argmax(duplicated))
        sample = frame.iloc[row]
        original = frame.index[(frame[key] == sample[key]).all(axis=1)][0]
        parquet = path.suffix.lower() in {".parquet", ".pq"}
        offset = 1 if parquet else 2
        label = "row" if parquet else "line"
        described = ", ".join(f"{k}={sample[k]}" for k in key)
        raise InputFileError(
            path,
            f"duplicate sample ({described}); first seen at {label} {int(original) + offset}",
            line=None if parquet else row + offset,
        )
