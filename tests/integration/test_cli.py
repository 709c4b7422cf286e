"""The CLI through its real console script: train, show, recommend (the evaluation contract), demo, bad input."""

from __future__ import annotations

import csv
import gzip
import io
import itertools
import json
import re
import socket
import time
from pathlib import Path
from typing import Any

import httpx
import pandas as pd
import pytest
import yaml

from recommender.units import cpu_on_grid
from tests.conftest import BUNDLED, Runner, entry_point, make_usage
from tests.integration.server import free_port, started

pytestmark = pytest.mark.integration
#: A progress line, as long commands print them when stderr is not a terminal.
PROGRESS = re.compile(r"\d\d:\d\d:\d\d \[\d+/\d+\] ")


def test_every_command_has_help(cli: Runner) -> None:
    for command in ("train", "recommend", "show", "serve", "demo", "backtest"):
        result = cli(command, "--help")
        assert result.returncode == 0, result.stderr
        assert "Usage" in result.stdout


def test_train_then_show_json(cli: Runner, tmp_path: Path, usage_csv: Path) -> None:
    trained = cli("train", "--input", str(usage_csv), "--store", "store")
    assert trained.returncode == 0, trained.stderr
    assert "published version" in trained.stderr
    shown = cli("show", "--store", "store", "--format", "json")
    assert shown.returncode == 0, shown.stderr
    payload = json.loads(shown.stdout)
    assert payload["version"] == (tmp_path / "store" / "latest").read_text().strip()
    assert {r["workload"] for r in payload["recommendations"]} == {"w0", "w1"}
    table = cli("show", "--store", "store")
    assert "w0" in table.stdout and "CPU x replicas" in table.stdout and "Totals per namespace" in table.stdout


def test_show_filters_and_writes_every_format_with_the_same_totals(cli: Runner, tmp_path: Path) -> None:
    """The issue's cases: a 2-core request with no limit, a 500m request with a 4-core limit (both against the
    request), memory that is requested (totals not zero); two replicas multiply the savings."""
    usage = make_usage(workloads=2, pods=2, days=2).drop(columns=["cpu_limit_cores", "memory_limit_bytes"])
    usage["cpu_request_cores"] = usage["workload"].map({"w0": 2.0, "w1": 0.5})
    usage["cpu_limit_cores"] = usage["workload"].map({"w0": None, "w1": 4.0})
    usage["memory_request_bytes"] = 3e9
    usage.loc[usage["workload"] == "w1", "namespace"] = "other"
    usage.sort_values(["namespace", "workload", "pod", "container", "timestamp"]).to_csv(
        tmp_path / "usage.csv", index=False
    )
    assert cli("train", "--input", "usage.csv", "--store", "store").returncode == 0
    payload = json.loads(cli("show", "--store", "store", "--format", "json").stdout)
    rows = {w["workload"]: w for w in payload["overview"]["workloads"]}
    targets = {r["workload"]: r for r in payload["recommendations"]}
    assert rows["w0"]["cpu_cores"]["current_request"] == 2.0 and rows["w1"]["cpu_cores"]["current_request"] == 0.5
    assert rows["w0"]["replicas"] == 2
    # One sign: change = recommended - current (negative frees resources), of the request as written.
    assert rows["w0"]["cpu_cores"]["change"] == pytest.approx(cpu_on_grid(targets["w0"]["cpu"]["target"]) - 2.0)
    assert rows["w0"]["cpu_cores"]["change_all_replicas"] == pytest.approx(2 * rows["w0"]["cpu_cores"]["change"])
    cluster = payload["overview"]["cluster"]
    assert cluster["memory_request_bytes"] == pytest.approx(6e9) and cluster["memory_recommended_bytes"] > 1e9
    assert cluster["cpu_request_cores_all_replicas"] == pytest.approx(5.0)
    assert set(payload["overview"]["namespaces"]) == {"ns", "other"}
    # Filters: the totals are those of what is shown.
    only = json.loads(cli("show", "--store", "store", "--format", "json", "--namespace", "oth*").stdout)
    assert [r["workload"] for r in only["recommendations"]] == ["w1"] and set(only["overview"]["namespaces"]) == {
        "other"
    }
    assert (
        json.loads(cli("show", "--store", "store", "--format", "json", "-w", "w0").stdout)["overview"]["cluster"][
            "containers"
        ]
        == 1
    )
    missing = cli("show", "--store", "store", "--namespace", "nowhere")
    assert (
        missing.returncode == 4
        and "no workload of version" in missing.stderr
        and "--namespace nowhere" in missing.stderr
    )
    # YAML is the JSON document; CSV a row a container; HTML one page with nothing to fetch.
    assert yaml.safe_load(cli("show", "--store", "store", "--format", "yaml").stdout) == payload
    table = list(csv.DictReader(io.StringIO(cli("show", "--store", "store", "--format", "csv").stdout)))
    assert [r["workload"] for r in table] == ["w0", "w1"] and float(table[0]["cpu_request_cores"]) == 2.0
    assert float(table[0]["cpu_change_cores_all_replicas"]) == pytest.approx(
        rows["w0"]["cpu_cores"]["change_all_replicas"]
    )
    written = cli("show", "--store", "store", "--format", "html", "--output", "report.html")
    assert written.returncode == 0 and "wrote html of 2 containers to report.html" in written.stderr
    page = (tmp_path / "report.html").read_text()
    assert page.startswith("<!doctype html>") and "ns/w0" in page and "Totals per namespace" in page
    assert "<script" not in page and "<link" not in page and "http" not in page and "url(" not in page


def test_help_shows_every_default_and_environment_variable(cli: Runner) -> None:
    def help_of(command: str) -> str:
        """The help without any whitespace: click wraps long words (env names) anywhere."""
        return "".join(cli(command, "--help").stdout.split())

    def squeezed(text: str) -> str:
        return "".join(text.split())

    for command in ("train", "show", "serve", "sync", "demo", "cluster-files"):
        text = cli(command, "--help").stdout
        # Rich markup once ate bracketed text: "Listen address ." with the default gone.
        assert not re.search(r"\w \.(\s|$)", text), text
        assert squeezed("[default: model-store; env KOORD_RECOMMENDER_STORE__PATH]") in help_of(command) or command in (
            "demo",
            "cluster-files",
        )
    serve = help_of("serve")
    assert squeezed("Listen address. [default: 127.0.0.1; env KOORD_RECOMMENDER_SERVE__HOST]") in serve
    assert squeezed("TCP port. [default: 8080; env KOORD_RECOMMENDER_SERVE__PORT]") in serve
    train = help_of("train")
    assert (
        squeezed("[default: 14d; env KOORD_RECOMMENDER_PROMETHEUS__HISTORY_SECONDS]") in train
        and "[default:24h]" in train
    )
    assert squeezed("[default: 8080; env KOORD_RECOMMENDER_SERVE__PORT]") in help_of("demo")
    assert "anchors.md" not in cli("backtest", "--help").stdout


def test_long_commands_print_progress_lines_when_not_on_a_terminal(cli: Runner, usage_csv: Path) -> None:
    trained = cli("train", "--input", str(usage_csv), "--store", "store")
    lines = [line for line in trained.stderr.splitlines() if PROGRESS.match(line)]
    assert len(lines) >= 4 and lines[0].endswith(")") and "reading" in lines[0] and "publishing" in lines[-1], (
        trained.stderr
    )
    assert re.search(r"\d\d:\d\d:\d\d done in \d+\.\d s", trained.stderr)


def test_recommend_contract_on_bundled_data(cli: Runner, tmp_path: Path) -> None:
    as_of = 1557900000  # 2019-05-15: one of the four jobs has history before it
    result = cli(
        "recommend", "--input", str(BUNDLED), "--as-of", str(as_of), "--horizon", "24h", "--output", "out.json"
    )
    assert result.returncode == 0, result.stderr
    out = json.loads((tmp_path / "out.json").read_text())
    assert out["as_of"] == as_of and out["horizon_seconds"] == 86400 and out["step_seconds"] == 300
    usage = pd.read_csv(BUNDLED)
    before = usage[usage["timestamp"] < as_of]
    assert {r["workload"] for r in out["recommendations"]} == set(before["workload"])
    for rec in out["recommendations"]:
        assert {"namespace", "workload", "container", "cpu", "memory"} <= rec.keys()
        for resource in ("cpu", "memory"):
            line = rec[resource]
            assert {"target", "lower_bound", "upper_bound", "short_term", "long_term", "peak"} <= line.keys()
            assert len(line["short_term"]) == 288
            assert_peak_coherent(line, as_of)
            assert line["lower_bound"] <= line["target"] <= line["upper_bound"]


def assert_peak_coherent(line: dict[str, Any], as_of: int) -> None:
    """Issue 39: every peak fell at the decision time, and the peak and the lines did not agree.
    The peak is a point forecast of the day's maximum, never below the short-term line's highest step; its
    time is the line's first highest step, strictly after the decision time and within the horizon, or None where
    the line has no time of maximum (highest already now, or to the horizon's end)."""
    short, peak = line["short_term"], line["peak"]
    assert 0 < max(short) <= peak["value"]
    if peak["at"] is None:
        first = short.index(max(short))
        assert first == 0 or set(short[first:]) == {max(short)}
    else:
        step = (peak["at"] - as_of) // 300
        assert as_of < peak["at"] < as_of + 300 * len(short) and peak["at"] == as_of + 300 * step
        assert step == short.index(max(short)) and min(short[step:]) < max(short)


def test_recommend_ignores_future_rows(cli: Runner, tmp_path: Path) -> None:
    usage = make_usage(workloads=2, pods=2, days=4)
    as_of = int(usage["timestamp"].min()) + 2 * 86400 + 1234
    usage.to_csv(tmp_path / "all.csv", index=False)
    usage[usage["timestamp"] < as_of].to_csv(tmp_path / "past.csv", index=False)
    future = usage[usage["timestamp"] >= as_of].assign(cpu_cores=100.0, memory_bytes=1e12)
    pd.concat([usage[usage["timestamp"] < as_of], future]).to_csv(tmp_path / "spiked.csv", index=False)
    outputs = {}
    for name in ("past", "spiked"):
        result = cli("recommend", "--input", f"{name}.csv", "--as-of", str(as_of), "--output", f"{name}.json")
        assert result.returncode == 0, result.stderr
        outputs[name] = json.loads((tmp_path / f"{name}.json").read_text())
    assert outputs["past"] == outputs["spiked"]


def test_bad_input_is_a_clear_error_and_keeps_the_store(cli: Runner, tmp_path: Path, usage_csv: Path) -> None:
    assert cli("train", "--input", str(usage_csv), "--store", "store").returncode == 0
    latest = (tmp_path / "store" / "latest").read_text()
    bad = tmp_path / "bad.csv"
    bad.write_text(
        "timestamp,namespace,workload,pod,container,cpu_cores,memory_bytes\n1,ns,w,p,c,1,1\n2,ns,w,p,c,lots,1\n"
    )
    result = cli("train", "--input", str(bad), "--store", "store")
    assert result.returncode == 2
    assert "bad.csv, line 3, column 'cpu_cores'" in result.stderr
    assert "Traceback" not in result.stderr
    assert (tmp_path / "store" / "latest").read_text() == latest
    assert len(list((tmp_path / "store" / "versions").iterdir())) == 1


def test_bad_flags_are_clear(cli: Runner, usage_csv: Path) -> None:
    result = cli("recommend", "--input", str(usage_csv), "--as-of", "1", "--horizon", "soon", "--output", "x.json")
    assert result.returncode == 2 and "--horizon" in result.stderr
    result = cli("recommend", "--input", str(usage_csv), "--as-of", "1", "--output", "x.json")
    assert result.returncode == 2 and "no usage rows before as-of 1" in result.stderr
    result = cli("show", "--store", "empty")
    assert result.returncode == 3 and "no model version published yet" in result.stderr


def test_bad_flags_and_outputs_are_one_line_and_leave_an_existing_output_whole(
    cli: Runner, tmp_path: Path, usage_csv: Path
) -> None:
    """Issue 39: tracebacks before (an --as-of beyond 64 bits, an --output that is a directory or under a file), and
    a --horizon of 100000d took 5.9 GB before it was killed."""
    (tmp_path / "out.json").write_text("kept")
    (tmp_path / "a-directory").mkdir()
    (tmp_path / "a-file").write_text("")
    as_of = str(int(pd.read_csv(usage_csv)["timestamp"].max()))
    cases = {
        ("--as-of", "99999999999999999999"): "--as-of 99999999999999999999: not a Unix time in seconds from 0 to "
        "253402300799 (the end of the year 9999)",
        ("--horizon", "100000d"): "--horizon 100000d: at most 7d, the long-term line's week",
        ("--output", "a-directory"): "--output a-directory: is a directory; give a file name",
        ("--output", "a-file/out.json"): "--output a-file/out.json: a-file is not a directory",
    }
    for (flag, value), says in cases.items():
        flags = {"--as-of": as_of, "--output": "out.json", flag: value}
        result = cli("recommend", "--input", str(usage_csv), *itertools.chain(*flags.items()))
        assert result.returncode == 2, result.stderr
        assert result.stderr.startswith(f"error: {says}") and result.stderr.count("\n") == 1, result.stderr
    trained = cli("train", "--input", str(usage_csv), "--store", "store", "--as-of", "-1")
    assert trained.returncode == 2 and "--as-of -1: not a Unix time" in trained.stderr
    assert (tmp_path / "out.json").read_text() == "kept" and not (tmp_path / "store").exists()
    # A message past 80 columns stays one line in a pipe or a log (rich folded it there, as a terminal would).
    long_name = f"{'long-name-' * 8}.json"
    wrote = cli("recommend", "--input", str(usage_csv), "--as-of", as_of, "--output", long_name)
    assert wrote.returncode == 0 and wrote.stderr.rstrip("\n").splitlines()[-1].endswith(f"to {long_name}"), (
        wrote.stderr
    )
    for command in ("recommend", "train"):  # the bound is in the help too (without the wrapping's whitespace)
        assert "atmost7d,thelong-termline'sweek" in "".join(cli(command, "--help").stdout.split())


def test_demo_without_serving(cli: Runner, tmp_path: Path) -> None:
    result = cli("demo", "--no-serve", "--workdir", "demo")
    assert result.returncode == 0, result.stderr
    assert "job-113812204462" in result.stdout and "CPU x replicas" in result.stdout
    # The 2019 trace is moved at load to end now (said so), the bundled file stays as it is.
    assert re.search(
        r"timestamps moved \+\d+\.\d days at load so the data ends now; the file is unchanged", result.stdout
    )
    assert int(pd.read_csv(BUNDLED, usecols=["timestamp"])["timestamp"].max()) < 1_600_000_000
    status = json.loads(cli("show", "--store", "demo/store", "--format", "json").stdout)
    assert abs(status["as_of"] - time.time()) < 900
    # Issue 39: every bundled job is live at the decision time (none stale, none left out of the totals), and every
    # peak is the forecast's own: after the decision time or none.
    assert len(status["recommendations"]) == 4 and status["overview"]["cluster"]["stale"] == 0
    for rec in status["recommendations"]:
        assert status["as_of"] - rec["history"]["last_sample"] <= 300, rec["workload"]
        for resource in ("cpu", "memory"):
            assert not rec[resource]["stale"]
            assert_peak_coherent(rec[resource], status["as_of"])
    chart = tmp_path / "demo" / "four-lines.png"
    assert chart.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and chart.stat().st_size > 20_000


def test_demo_serves_the_dashboard_and_says_where(tmp_path: Path) -> None:
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    command = [entry_point(), "demo", "--workdir", "demo", "--port", str(port)]
    with started(command, base, cwd=tmp_path, env={"DISPLAY": "", "WAYLAND_DISPLAY": ""}, wait_seconds=180) as logs:
        page = httpx.get(base + "/", follow_redirects=True, timeout=10)
        assert page.status_code == 200 and str(page.url) == base + "/ui/" and "app.js" in page.text
        logs.seek(0)
        output = logs.read().decode(errors="replace")
    assert f"dashboard: {base}/ui/" in output and "no display here" in output
    # The tunnel's command whole on one line (not wrapped mid-command), naming the port served and a host to fill in.
    assert f"\n  ssh -L {port}:127.0.0.1:{port} user@host\n" in output


def test_a_taken_port_is_one_line_naming_it_with_its_own_exit_code(cli: Runner, tmp_path: Path) -> None:
    """Issue 39: uvicorn's JSON log line and exit 3 (the model store's) after the URL; `demo` after its training."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = str(taken.getsockname()[1])
        for command in (["serve", "--store", "store"], ["demo", "--workdir", "demo", "--no-open"]):
            result = cli(*command, "--port", port, env={"KOORD_RECOMMENDER_SERVE__HOST": "127.0.0.1"})
            assert result.returncode == 9, result.stderr
            assert result.stderr == (
                f"error: port {port} on 127.0.0.1 is already in use: choose another port with --port "
                "(or KOORD_RECOMMENDER_SERVE__PORT)\n"
            )
            assert result.stdout == ""
    assert not (tmp_path / "demo").exists()


def test_incremental_training_from_files(cli: Runner, tmp_path: Path) -> None:
    usage = make_usage(workloads=2, pods=2, days=3)
    cut = int(usage["timestamp"].min()) + 2 * 86400
    usage[usage["timestamp"] < cut].to_csv(tmp_path / "first.csv", index=False)
    usage.to_csv(tmp_path / "all.csv", index=False)
    assert cli("train", "--input", "first.csv", "--store", "inc").returncode == 0
    more = cli("train", "--input", "all.csv", "--store", "inc", "--incremental")
    assert more.returncode == 0, more.stderr
    assert "continued from" in more.stderr
    again = cli("train", "--input", "all.csv", "--store", "inc", "--incremental")
    assert again.returncode == 2 and "has no rows after" in again.stderr
    assert cli("train", "--input", "all.csv", "--store", "full").returncode == 0
    inc, full = (
        json.loads(cli("show", "--store", s, "--format", "json").stdout)["recommendations"] for s in ("inc", "full")
    )
    for a, b in zip(inc, full):
        assert a["cpu"]["target"] == pytest.approx(b["cpu"]["target"])
        assert a["memory"]["upper_bound"] == pytest.approx(b["memory"]["upper_bound"])
        assert a["cpu"]["short_term"] == pytest.approx(b["cpu"]["short_term"])


def _bad_files(tmp_path: Path) -> dict[str, tuple[Path, str]]:
    """Hostile files (issue 13) and what each error must say after the file name."""
    header = "timestamp,namespace,workload,pod,container,cpu_cores,memory_bytes\n"
    lines = [f"{1_700_000_000 + 300 * i},ns,w,p,c,0.5,1000000\n" for i in range(3000)]
    rows = "".join(lines)
    compressed = gzip.compress((header + rows).encode())
    files = {
        "truncated.csv.gz": compressed[: len(compressed) // 2],
        "quote.csv": (header + "".join(lines[:5]) + '1,"ns,w,p,c,1,1\n' + rows).encode(),
        "int64.csv": (header + "99999999999999999999,ns,w,p,c,1,1\n").encode(),
        "header.csv": header.strip().encode(),
        "latin1.csv": (header + "1,ns,w\xe9,p,c,1,1\n").encode("latin-1"),
        "millis.csv": (header + "".join(lines[:3]) + "1700000000000,ns,w,p,c,1,1\n").encode(),
        "huge.csv": (header + "1,ns,w,p,c,1e300,1\n").encode(),
        "long-cell.csv": (header + f"1700000000,ns,{'w' * 200_000},p,c,1,1\n" + "1700000300,ns,w,p,c,x,1\n").encode(),
        "long-number.csv": (header + f"1700000000,ns,w,p,c,{'x' * 100_000},1\n").encode(),
    }
    expected = {
        "truncated.csv.gz": r", line \d+: cannot be read: Compressed file ended before the end-of-stream marker",
        "quote.csv": r", line 7, column 'namespace': .*unterminated quote",
        "int64.csv": r", line 2, column 'timestamp': timestamp 99999999999999999999 does not fit in 64 bits",
        "header.csv": r": has no usage rows",
        "latin1.csv": r", line 2, column 'workload': byte 0xe9 at character 7 is not UTF-8",
        "millis.csv": r", line 5, column 'timestamp': timestamp 1700000000000 is in the future",
        "huge.csv": r", line 2, column 'cpu_cores': cpu_cores 1e\+300 is above the ceiling of 2048 cores",
        "long-cell.csv": r", line 2, column 'workload': the cell is longer than 131,072 characters",
        "long-number.csv": r", line 2, column 'cpu_cores': 'x{40}'\.\.\. \(100,000 characters\) is not a number",
    }
    for name, data in files.items():
        (tmp_path / name).write_bytes(data)
    return {name: (tmp_path / name, expected[name]) for name in files}


@pytest.mark.parametrize(
    ("name", "command"),
    [(name, "train") for name in ("truncated.csv.gz", "quote.csv", "header.csv", "millis.csv", "long-cell.csv")]
    + [(name, "recommend") for name in ("truncated.csv.gz", "long-cell.csv", "long-number.csv")],
)
def test_hostile_files_are_one_line_errors_with_the_bad_input_code(
    cli: Runner, tmp_path: Path, name: str, command: str
) -> None:
    _path, expected = _bad_files(tmp_path)[name]
    args = ["--store", "store"] if command == "train" else ["--as-of", "1800000000", "--output", "out.json"]
    result = cli(command, "--input", name, *args)
    assert result.returncode == 2, result.stderr
    # Beside the progress lines a log gets (stderr is no terminal here), the error is one line.
    lines = [line for line in result.stderr.strip().splitlines() if not PROGRESS.match(line)]
    assert len(lines) == 1, result.stderr
    assert re.fullmatch("error: " + re.escape(name) + expected + ".*", lines[0]), result.stderr[:1000]
    assert len(lines[0]) < 300, "a cell is quoted by its first characters only"
    assert not (tmp_path / "store").exists() and not (tmp_path / "out.json").exists()


def test_show_and_errors_print_names_without_terminal_escapes(cli: Runner, tmp_path: Path) -> None:
    usage = make_usage(workloads=1, pods=1, days=1)
    usage["workload"] = "w\x1b[2J\x1b]0;pwned\x07"
    usage["container"] = "c\u202e[bold]x[/bold]"
    usage.to_csv(tmp_path / "evil.csv", index=False)
    assert cli("train", "--input", "evil.csv", "--store", "store").returncode == 0
    shown = cli("show", "--store", "store")
    assert shown.returncode == 0, shown.stderr
    assert "\x1b" not in shown.stdout and "\x07" not in shown.stdout and "\u202e" not in shown.stdout
    assert "ns/w\\x1b[2J\\x1b]0;pwned\\x07" in shown.stdout and "c\\u202e[bold]x[/bold]" in shown.stdout
    pd.concat([usage, usage.head(1)]).to_csv(tmp_path / "evil\x1b[31m.csv", index=False)
    failed = cli("train", "--input", "evil\x1b[31m.csv", "--store", "store")
    assert failed.returncode == 2
    assert "\x1b" not in failed.stderr and "\x07" not in failed.stderr
    assert "evil\\x1b[31m.csv" in failed.stderr and "duplicate sample" in failed.stderr


def test_replay_writes_the_live_lines_contract_with_progress(cli: Runner, tmp_path: Path) -> None:
    """`recommender replay`: the Parquet that ../shared/eval/rolling.py reads, a line per container, resource, issue
    and step, built from earlier rows (tests/unit/test_live_line.py checks the no-peeking in depth)."""
    start = 1_700_006_400  # a midnight
    make_usage(workloads=3, pods=2, days=9, start=start).to_csv(tmp_path / "usage.csv.gz", index=False)
    result = cli(
        "replay", "--input", "usage.csv.gz", "--start", str(start + 8 * 86400), "--end", str(start + 8 * 86400 + 6 * 3600),
        "--every", "1h", "--output", "lines.parquet", "--target-violation", "0.05",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert PROGRESS.search(result.stderr) and "wrote" in result.stderr
    lines = pd.read_parquet(tmp_path / "lines.parquet")
    assert list(lines.columns) == ["namespace", "workload", "container", "resource", "issued_at", "step", "value"]
    assert len(lines) == 3 * 2 * 6 * 12
    assert ((lines["step"] >= lines["issued_at"]) & (lines["step"] < lines["issued_at"] + 3600)).all()
    assert (lines["value"] > 0).all()


@pytest.mark.parametrize(
    ("arguments", "names"),
    [
        (["--start", "yesterday-ish"], "--start"),
        (["--start", "1700006401"], "--start"),
        (["--every", "7m"], "--every"),
        (["--end", "1700000000"], "--end"),
        (["--output", "."], "--output"),
        (["--target-violation", "0.7"], "--target-violation"),
    ],
)
def test_replay_refuses_bad_arguments_in_one_line(
    cli: Runner, tmp_path: Path, usage_csv: Path, arguments: list[str], names: str
) -> None:
    defaults = {"--start": "1700006400", "--end": "1700092800", "--every": "1h", "--output": "out.parquet"}
    given = dict(zip(arguments[::2], arguments[1::2]))
    flat = [x for key, value in {**defaults, **given}.items() for x in (key, value)]
    result = cli("replay", "--input", str(usage_csv), *flat)
    assert result.returncode == 2, result.stderr
    assert len(result.stderr.strip().splitlines()) == 1 and names in result.stderr
    assert not (tmp_path / "out.parquet").exists()
