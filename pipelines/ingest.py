"""Reading tidy usage files (CSV, gzipped CSV, Parquet) with validation that names the file, line and problem.

The fast path parses with pyarrow into typed columns. When that fails, or a typed check finds a bad value, the
error points at the 1-based line of the file (the header is line 1; for Parquet, the 1-based row) and the column.
Every value must be physically possible (`SampleBounds`: finite, not negative, under the per-container ceilings, no
timestamp past the run's clock); docs/input-validation.md lists the guarantees. Reading never writes anything, so a
bad file cannot damage what earlier runs produced.
"""

from __future__ import annotations

import csv
import gzip
import io
import itertools
import logging
import math
import re
import zlib
from collections.abc import Generator, Iterator, Mapping
from contextlib import closing
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Literal

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv
import pyarrow.parquet as pq

from pipelines.settings import IngestSettings
from recommender.errors import InputFileError, PrometheusError
from recommender.text import printable

log = logging.getLogger(__name__)

Kind = Literal["id", "timestamp", "value"]
Quantity = Literal["cpu", "memory", "fraction"]
INT64_MAX = 2**63 - 1
#: The most characters a cell may hold: the csv module's limit, which the slow re-read of a file runs into (a
#: Kubernetes name has at most 253).
MAX_CELL_CHARACTERS = csv.field_size_limit()
_TOO_LONG = f"the cell is longer than {MAX_CELL_CHARACTERS:,} characters, the most a cell may hold"
#: Characters of a cell an error message quotes, at most.
_EXCERPT_CHARACTERS = 40
#: One field of a CSV line: quoted (closed or not) or plain, however long (`_field_lengths`).
_FIELD = re.compile(r'"[^"]*(?:""[^"]*)*"?[^,]*|[^,]*')


@dataclass(frozen=True)
class Column:
    name: str
    kind: Kind
    required: bool
    quantity: Quantity | None = None


@dataclass(frozen=True)
class SampleBounds:
    """What a sample may hold in one run: the settings' ceilings and the latest timestamp the run's clock allows."""

    max_cpu_cores: float
    max_memory_bytes: float
    latest_timestamp: int

    @classmethod
    def at(cls, settings: IngestSettings, now: float) -> SampleBounds:
        """The bounds of a run whose clock reads `now` (Unix seconds)."""
        return cls(settings.max_cpu_cores, settings.max_memory_bytes, int(now + settings.future_tolerance_seconds))

    def ceiling(self, quantity: Quantity) -> tuple[float, str]:
        """The largest value of a quantity, and how to say it."""
        if quantity == "cpu":
            return self.max_cpu_cores, f"{self.max_cpu_cores:g} cores per container (ingest.max_cpu_cores)"
        if quantity == "memory":
            return self.max_memory_bytes, f"{self.max_memory_bytes:g} bytes per container (ingest.max_memory_bytes)"
        return 1.0, "1 (a share of the CFS periods)"

    def value_problem(self, column: Column, value: float) -> str | None:
        """Why a parsed value is impossible, or None (NaN: a missing value, checked by the caller)."""
        if math.isinf(value):
            return f"{value} is not a finite number"
        if value < 0:
            return f"negative {column.name} {value}: usage, limits and requests cannot be below 0"
        if column.quantity is not None:
            limit, said = self.ceiling(column.quantity)
            if value > limit:
                return f"{column.name} {value:g} is above the ceiling of {said}"
        return None

    def future_problem(self, timestamp: float) -> str:
        latest = datetime.fromtimestamp(self.latest_timestamp, UTC).isoformat(timespec="seconds")
        return (
            f"timestamp {timestamp:.0f} is in the future, after {latest} (the run's clock + "
            "ingest.future_tolerance_seconds): timestamps are Unix seconds, not milliseconds"
        )


#: The tidy usage format of shared/data/README.md.
USAGE_SCHEMA: tuple[Column, ...] = (
    Column("timestamp", "timestamp", True),
    Column("namespace", "id", True),
    Column("workload", "id", True),
    Column("pod", "id", True),
    Column("container", "id", True),
    Column("cpu_cores", "value", True, "cpu"),
    Column("memory_bytes", "value", True, "memory"),
    Column("cpu_limit_cores", "value", False, "cpu"),
    Column("memory_limit_bytes", "value", False, "memory"),
    Column("cpu_request_cores", "value", False, "cpu"),
    Column("memory_request_bytes", "value", False, "memory"),
    Column("cpu_throttled_fraction", "value", False, "fraction"),
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
    Column("memory_bytes", "value", False, "memory"),
)

_SAMPLE_KEY = ["namespace", "workload", "pod", "container", "timestamp"]
#: What pyarrow raises on a file it cannot parse or decompress (a truncated gzip stream is an OSError).
_ARROW_ERRORS = (pa.ArrowException, OSError)


def read_usage(path: Path | str, bounds: SampleBounds) -> pd.DataFrame:
    """Read and validate a tidy usage file; rows come back sorted as the format says."""
    frame, lines = _read_checked(Path(path), USAGE_SCHEMA, bounds)
    return sorted_samples(frame, Path(path), lines)


def sorted_samples(frame: pd.DataFrame, source: Path | str, lines: np.ndarray | None = None) -> pd.DataFrame:
    """Usage rows sorted as the format says, refusing a duplicate sample (naming where it was first seen when the
    rows' `lines` in `source` are known): every reader of usage rows, a whole file or one partition's, ends here."""
    _check_unique(Path(source), frame, _SAMPLE_KEY, lines)
    return frame.sort_values(_SAMPLE_KEY, kind="stable").reset_index(drop=True)


def read_oom_events(path: Path | str, bounds: SampleBounds) -> pd.DataFrame:
    """Read and validate an OOM events file."""
    return read_table(Path(path), OOM_SCHEMA, bounds)


def read_table(path: Path, schema: tuple[Column, ...], bounds: SampleBounds) -> pd.DataFrame:
    """Read a CSV, CSV.gz or Parquet file against a schema; raise InputFileError on the first problem."""
    return _read_checked(path, schema, bounds)[0]


def _read_checked(path: Path, schema: tuple[Column, ...], bounds: SampleBounds) -> tuple[pd.DataFrame, np.ndarray]:
    """`read_table`'s frame, and the line (Parquet: row) each of its rows starts at."""
    parquet, wanted = _columns_present(path, schema)
    try:
        table = _read_parquet(path, wanted) if parquet else _read_csv(path, wanted)
    except _ARROW_ERRORS as error:
        if parquet:
            raise InputFileError(path, "has a column of the wrong type (see the schema in docs/cli.md)") from None
        _raise_located(path, wanted, bounds, error)
        table = pa.table({c.name: pa.array([], type=_arrow_type(c)) for c in wanted})
    frame, lines, _ = _typed_frame(path, table, schema, wanted, 1 if parquet else 2, parquet, bounds)
    return frame, lines


def iter_usage_batches(path: Path | str, bounds: SampleBounds, batch_bytes: int = 64 << 20) -> Iterator[pd.DataFrame]:
    """A usage file streamed as validated frames (about `batch_bytes` of CSV or one Parquet row group each), with
    errors naming the file's line as `read_usage` does. Memory stays bounded whatever the file's size: this is how
    distributed training splits a file into partitions (a gzip CSV cannot be seeked, so it is read through once).
    Duplicate samples are not checked here (that needs a whole workload); `read_usage` of a partition does."""
    path = Path(path)
    parquet, wanted = _columns_present(path, USAGE_SCHEMA)
    first = 1 if parquet else 2
    try:
        if parquet:
            handle = pq.ParquetFile(path)
            batches: Iterator[pa.RecordBatch] = handle.iter_batches(columns=[c.name for c in wanted])
        else:
            batches = iter(
                pacsv.open_csv(
                    path, read_options=pacsv.ReadOptions(block_size=batch_bytes), convert_options=_csv_options(wanted)
                )
            )
        for batch in batches:
            table = pa.Table.from_batches([batch])
            frame, _, first = _typed_frame(
                path,
                _cast_parquet(path, table, wanted) if parquet else table,
                USAGE_SCHEMA,
                wanted,
                first,
                parquet,
                bounds,
            )
            yield frame
    except _ARROW_ERRORS as error:
        if parquet:
            raise InputFileError(path, "has a column of the wrong type (see the schema in docs/cli.md)") from None
        _raise_located(path, wanted, bounds, error)


def _raise_located(path: Path, columns: list[Column], bounds: SampleBounds, arrow_error: Exception) -> None:
    """Raise the problem the slow re-read finds in a CSV the fast parser refused; return when the file has no data
    row (a header without a newline: an empty table, for the caller to judge)."""
    problem = _locate_csv_problem(path, columns, bounds, arrow_error)
    if problem is not None:
        raise problem


def _columns_present(path: Path, schema: tuple[Column, ...]) -> tuple[bool, list[Column]]:
    """Whether the file is Parquet, and the schema's columns its header has (after checking the header)."""
    if not path.is_file():
        raise InputFileError(path, "no such file")
    parquet = path.suffix.lower() in {".parquet", ".pq"}
    try:
        header = _parquet_columns(path) if parquet else _csv_header(path)
    except (OSError, pa.ArrowException) as error:
        raise InputFileError(path, f"cannot be read: {error}") from error
    _check_header(path, header, schema, line=None if parquet else 1)
    return parquet, [c for c in schema if c.name in header]


def _typed_frame(
    path: Path,
    table: pa.Table,
    schema: tuple[Column, ...],
    wanted: list[Column],
    first: int,
    parquet: bool,
    bounds: SampleBounds,
) -> tuple[pd.DataFrame, np.ndarray, int]:
    """The checked frame of rows starting at line (Parquet: 1-based row) `first`, with every value column of the
    schema; the line (row) each row starts at, and the one after the last."""
    # NaN written as such ("nan" in a CSV, a NaN float in Parquet) is refused; only an empty cell or a null is missing.
    literal_nan = {
        c.name: pc.is_nan(table[c.name]).fill_null(False).to_numpy(zero_copy_only=False)
        for c in wanted
        if c.kind != "id"
    }
    # Names longer than the slow re-read can take are refused on the fast path too: one rule whichever path reads.
    long_cells = {}
    for column in wanted:
        if column.kind == "id":
            lengths = pc.utf8_length(table[column.name])
            if (pc.max(lengths).as_py() or 0) > MAX_CELL_CHARACTERS:
                too_long = pc.greater(lengths, MAX_CELL_CHARACTERS).fill_null(False)
                long_cells[column.name] = too_long.to_numpy(zero_copy_only=False)
    # A quoted line break in a name makes its row take more than one line.
    spans = np.ones(table.num_rows, dtype=np.int64)
    if not parquet:
        for column in wanted:
            if column.kind == "id":
                spans += pc.count_substring(table[column.name], "\n").fill_null(0).to_numpy(zero_copy_only=False)
    ends = first + np.cumsum(spans)
    lines = ends - spans
    frame: pd.DataFrame = _blank_as_missing(table, wanted).to_pandas()
    _check_values(path, frame, wanted, literal_nan, long_cells, bounds, lines, unit="row" if parquet else "line")
    frame["timestamp"] = frame["timestamp"].astype(np.int64)
    for column in schema:
        if column.name not in frame.columns and column.kind == "value":
            frame[column.name] = np.nan
    return frame, lines, int(ends[-1]) if len(ends) else first


def _blank_as_missing(table: pa.Table, columns: list[Column]) -> pa.Table:
    """The table with the empty (or blank) cells of its optional name columns as nulls: a pod not yet placed has no
    node, one without a PriorityClass none, and either is a missing value, not a bad row."""
    for column in columns:
        if column.kind == "id" and not column.required:
            values = table[column.name]
            blank = pc.equal(pc.utf8_trim_whitespace(values), "")
            table = table.set_column(
                table.schema.get_field_index(column.name),
                column.name,
                pc.if_else(blank, pa.scalar(None, values.type), values),
            )
    return table


def _parquet_columns(path: Path) -> list[str]:
    return list(pq.read_schema(path).names)


def _open_binary(path: Path) -> io.BufferedIOBase:
    return gzip.open(path, "rb") if path.suffix.lower() == ".gz" else open(path, "rb")


def _physical_lines(path: Path, header: list[str] | None) -> Generator[str, None, None]:
    """The file's lines as text, decoded one at a time, so bytes that are not UTF-8 and a compressed stream that
    ends early become errors naming their line (and, once the header is known, the column)."""
    line = 0
    try:
        with _open_binary(path) as handle:
            for line, raw in enumerate(handle, start=1):
                try:
                    text = raw.decode("utf-8")
                except UnicodeDecodeError as error:
                    raise _encoding_error(path, raw, error, line, header) from None
                yield text.lstrip("\ufeff") if line == 1 else text
    except (OSError, EOFError, zlib.error) as error:
        raise InputFileError(path, f"cannot be read: {error} (truncated or corrupt from here)", line=line + 1) from None


def _encoding_error(
    path: Path, raw: bytes, error: UnicodeDecodeError, line: int, header: list[str] | None
) -> InputFileError:
    prefix = raw[: error.start].decode("utf-8")
    field = len(_field_lengths(prefix)) - 1
    return InputFileError(
        path,
        f"byte 0x{raw[error.start]:02x} at character {len(prefix) + 1} is not UTF-8 (save the file as UTF-8)",
        line=line,
        column=header[field] if header is not None and field < len(header) else None,
    )


def _csv_header(path: Path) -> list[str]:
    with closing(_physical_lines(path, None)) as lines:
        try:
            first = next(csv.reader(lines), None)
        except csv.Error as error:
            raise InputFileError(
                path, _TOO_LONG if "field limit" in str(error) else f"is not valid CSV: {error}", line=1
            ) from None
    if first is None:
        raise InputFileError(path, "is empty: expected a header row", line=1)
    return [name.strip() for name in first]


def _check_header(path: Path, header: list[str], schema: tuple[Column, ...], line: int | None) -> None:
    missing = [c.name for c in schema if c.required and c.name not in header]
    if missing:
        raise InputFileError(
            path,
            f"missing required column(s) {', '.join(missing)}; header has {', '.join(map(_excerpt, header))}",
            line=line,
        )
    seen: set[str] = set()
    for name in header:
        if name in seen:
            raise InputFileError(path, f"column '{_excerpt(name)}' appears twice in the header", line=line)
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
        if column.kind == "id" and not _holds_strings(field.type):
            raise InputFileError(path, f"column '{column.name}' must hold strings, holds {field.type}")
        if column.kind != "id" and not (pa.types.is_integer(field.type) or pa.types.is_floating(field.type)):
            raise InputFileError(path, f"column '{column.name}' must be numeric, holds {field.type}")
        casts.append(target if column.kind != "timestamp" or pa.types.is_integer(field.type) else pa.float64())
    return table.cast(pa.schema([(c.name, t) for c, t in zip(columns, casts)]))


def _holds_strings(kind: pa.DataType) -> bool:
    """Strings, or strings dictionary-encoded (pandas writes its categorical columns so): the cast decodes them."""
    if pa.types.is_dictionary(kind):
        kind = kind.value_type
    return bool(pa.types.is_string(kind) or pa.types.is_large_string(kind))


def _records(path: Path, header: list[str]) -> Iterator[tuple[int, int, list[str]]]:
    """(first line, last line, fields) of each data row; physical lines, so a quoted newline keeps numbers right."""
    with closing(_physical_lines(path, header)) as lines:
        reader = csv.reader(lines)
        next(reader, None)
        while True:
            start = reader.line_num + 1
            try:
                fields = next(reader)
            except StopIteration:
                return
            except csv.Error as error:
                if "field limit" in str(error) and reader.line_num == start:  # one line: a long cell, not a quote
                    raise _long_cell(path, header, start) from None
                if "field limit" in str(error):
                    raise InputFileError(
                        path,
                        f"unterminated quote: the quoted field opened here never closes ({error})",
                        line=start,
                        column=_quoted_column(path, header, start),
                    ) from None
                raise InputFileError(path, f"is not valid CSV: {error}", line=start) from None
            yield start, reader.line_num, fields


def _long_cell(path: Path, header: list[str], line: int) -> InputFileError:
    """The error for a line with a cell longer than the csv module takes, naming the column of its longest cell."""
    with closing(_physical_lines(path, header)) as lines:
        lengths = _field_lengths(next(itertools.islice(lines, line - 1, None), ""))
    field = lengths.index(max(lengths))
    return InputFileError(path, _TOO_LONG, line=line, column=header[field] if field < len(header) else None)


def _field_lengths(line: str) -> list[int]:
    """The length of each field of one CSV line (quotes respected; the last one's line break counted), however long
    they are: the csv module stops at `MAX_CELL_CHARACTERS`."""
    lengths, position = [], 0
    while True:
        match = _FIELD.match(line, position)
        assert match is not None  # every alternative can match nothing
        lengths.append(match.end() - position)
        if match.end() >= len(line):
            return lengths
        position = match.end() + 1  # past the comma


def _excerpt(text: str, quoted: bool = False) -> str:
    """A cell as an error shows it (`quoted`: as repr does): never more than its first characters, and then how many
    it has."""
    head = text[:_EXCERPT_CHARACTERS]
    shown = repr(head) if quoted else head
    return shown if len(text) == len(head) else f"{shown}... ({len(text):,} characters)"


def _quoted_column(path: Path, header: list[str], line: int) -> str | None:
    """The column whose quote a line leaves open (its last field, parsed alone), when the header names it."""
    with closing(_physical_lines(path, header)) as lines:
        text = next(itertools.islice(lines, line - 1, None), "")
    field = len(next(csv.reader([text]), [""])) - 1
    return header[field] if 0 <= field < len(header) else None


def _locate_csv_problem(
    path: Path, columns: list[Column], bounds: SampleBounds, arrow_error: Exception
) -> InputFileError | None:
    """Slow re-read that finds the first line the fast parser choked on and says what is wrong with it; None when
    the file has no data row at all (nothing is wrong with it but emptiness, which the caller judges)."""
    header = _csv_header(path)
    position = {name: i for i, name in enumerate(header)}
    rows = 0
    for first, last, fields in _records(path, header):
        rows += 1
        if len(fields) != len(header):
            problem = f"has {len(fields)} fields, the header has {len(header)}"
            if last > first:
                return InputFileError(
                    path,
                    f"{problem}: a quote opened on this line runs to line {last} (unterminated quote?)",
                    line=first,
                    column=_quoted_column(path, header, first),
                )
            return InputFileError(path, problem, line=first)
        for column in columns:
            cell = fields[position[column.name]].strip()
            found = _cell_problem(column, cell, bounds)
            if found:
                return InputFileError(path, found, line=first, column=column.name)
    if rows == 0:
        return None
    # pyarrow's message quotes the rows it read, line breaks and all: its first line is the one that says why.
    return InputFileError(path, f"could not be parsed as CSV: {(str(arrow_error).splitlines() or [''])[0]}")


def _cell_problem(column: Column, cell: str, bounds: SampleBounds) -> str | None:
    """What is wrong with one cell, as the typed checks of `_check_values` would say it."""
    if column.kind == "id":
        return f"'{column.name}' is empty" if not cell and column.required else None
    if not cell:
        return f"'{column.name}' is empty" if column.kind == "timestamp" else None
    if column.kind == "timestamp":
        try:
            timestamp = int(cell.replace("_", "?"))
        except ValueError:
            return f"timestamp {_excerpt(cell, quoted=True)} is not a whole number of Unix seconds"
        if timestamp < 0:
            return f"timestamp {_excerpt(str(timestamp))} is negative"
        if timestamp > INT64_MAX:
            return f"timestamp {_excerpt(str(timestamp))} does not fit in 64 bits: timestamps are Unix seconds"
        return bounds.future_problem(timestamp) if timestamp > bounds.latest_timestamp else None
    try:
        value = float(cell.replace("_", "?"))
    except ValueError:
        return f"{_excerpt(cell, quoted=True)} is not a number"
    if math.isnan(value):
        return f"{_excerpt(cell, quoted=True)} is not a finite number (a missing value is an empty cell)"
    return bounds.value_problem(column, value)


def _check_values(
    path: Path,
    frame: pd.DataFrame,
    columns: list[Column],
    literal_nan: dict[str, np.ndarray],
    long_cells: dict[str, np.ndarray],
    bounds: SampleBounds,
    lines: np.ndarray,
    unit: str,
) -> None:
    """Typed checks over whole columns; report the first offending row by its line (Parquet: row) number."""

    def fail(mask: np.ndarray, column: Column, describe: str | None = None) -> None:
        row = int(np.argmax(mask))
        value = frame[column.name].iloc[row]
        problem = describe or _cell_problem_of(column, float(value), bounds)
        if unit == "line":
            raise InputFileError(path, problem, line=int(lines[row]), column=column.name)
        raise InputFileError(path, f"row {lines[row]}: {problem}", column=column.name)

    for column in columns:
        series = frame[column.name]
        if column.kind == "id":
            if column.name in long_cells:
                fail(long_cells[column.name], column, _TOO_LONG)
            if column.required:
                bad = series.isna().to_numpy() | (series.astype(str).str.strip() == "").to_numpy()
                if bad.any():
                    fail(bad, column, f"'{column.name}' is empty")
            continue
        if literal_nan[column.name].any():
            fail(
                literal_nan[column.name],
                column,
                "nan is not a finite number (a missing value is an empty cell or a null)",
            )
        values = series.to_numpy(dtype=np.float64, na_value=np.nan)
        with np.errstate(invalid="ignore"):
            if column.kind == "timestamp":
                bad = (
                    np.isnan(values) | (values != np.floor(values)) | (values < 0) | (values > bounds.latest_timestamp)
                )
            else:
                limit = bounds.ceiling(column.quantity)[0] if column.quantity is not None else np.inf
                bad = np.isinf(values) | (values < 0) | (values > limit)
        if bad.any():
            fail(bad, column)


def _cell_problem_of(column: Column, value: float, bounds: SampleBounds) -> str:
    """The problem of a typed value the column checks flagged, worded as for a CSV cell."""
    if column.kind == "timestamp":
        if math.isnan(value) or value != math.floor(value):
            return f"timestamp {value!r} is not a whole number of Unix seconds"
        return f"timestamp {value:.0f} is negative" if value < 0 else bounds.future_problem(value)
    return bounds.value_problem(column, value) or f"{value} is out of bounds"


def quarantine(
    usage: pd.DataFrame, bounds: SampleBounds, nan_samples: Mapping[tuple[str, str, str], str] | None = None
) -> tuple[pd.DataFrame, dict[str, str]]:
    """Usage read from a source that cannot be refused as a whole (Prometheus) without every workload container
    that has an impossible sample, and `namespace/workload/container` -> why for each, each logged: one broken
    exporter or counter must not size anything, nor stop the rest of the fleet from being trained. `nan_samples`:
    the containers the source saw a NaN of ((namespace, workload, container) -> why), which `usage` cannot show."""
    bad = np.zeros(len(usage), dtype=bool)
    why = np.full(len(usage), "", dtype=object)
    times = usage["timestamp"].to_numpy(dtype=np.float64)
    future = times > bounds.latest_timestamp
    why[future] = [bounds.future_problem(t) for t in times[future]]
    bad |= future
    for column in USAGE_SCHEMA:
        if column.kind != "value" or column.name not in usage.columns:
            continue
        values = usage[column.name].to_numpy(dtype=np.float64, na_value=np.nan)
        limit = bounds.ceiling(column.quantity)[0] if column.quantity is not None else np.inf
        with np.errstate(invalid="ignore"):
            broken = ~bad & (np.isinf(values) | (values < 0) | (values > limit))
        why[broken] = [f"{bounds.value_problem(column, v)} at {t:.0f}" for v, t in zip(values[broken], times[broken])]
        bad |= broken
    if not bad.any() and not nan_samples:
        return usage, {}
    keys = ["namespace", "workload", "container"]
    first = usage.loc[bad, keys].assign(why=why[bad]).drop_duplicates(keys)
    found = {(ns, workload, container): reason for ns, workload, container, reason in first.itertuples(index=False)}
    for key, reason in (nan_samples or {}).items():
        found.setdefault(key, reason)
    quarantined = {"/".join(key): reason for key, reason in found.items()}
    for name, reason in quarantined.items():
        log.warning("quarantined %s (none of its samples are used): %s", printable(name), reason)
    dropped = pd.MultiIndex.from_frame(usage[keys]).isin(pd.MultiIndex.from_tuples(list(found), names=keys))
    return usage[~dropped].reset_index(drop=True), quarantined


def no_samples_error(source: str, start: int, end: int, quarantined: Mapping[str, str]) -> PrometheusError:
    """A read without a usage sample left: why, when the quarantine dropped every container that had some."""
    if not quarantined:
        return PrometheusError(f"{source}: no usage samples between {start} and {end}")
    name, why = next(iter(quarantined.items()))
    return PrometheusError(
        f"{source}: no usage samples left between {start} and {end}: all {len(quarantined)} container(s) with "
        f"samples were quarantined for an impossible sample (see the warnings), the first {printable(name)}: {why}"
    )


def _check_unique(path: Path, frame: pd.DataFrame, key: list[str], lines: np.ndarray | None) -> None:
    duplicated = frame.duplicated(subset=key, keep="first").to_numpy()
    if duplicated.any():
        row = int(np.argmax(duplicated))
        sample = frame.iloc[row]
        described = ", ".join(f"{k}={_excerpt(str(sample[k]))}" for k in key)
        if lines is None:
            raise InputFileError(path, f"duplicate sample ({described})")
        original = frame.index[(frame[key] == sample[key]).all(axis=1)][0]
        parquet = path.suffix.lower() in {".parquet", ".pq"}
        label = "row" if parquet else "line"
        raise InputFileError(
            path,
            f"duplicate sample ({described}); first seen at {label} {lines[int(original)]}",
            line=None if parquet else int(lines[row]),
        )
