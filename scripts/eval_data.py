#!/usr/bin/env python3
"""Evaluation data for the forecasting protocol of docs/benchmarks.md, written as tidy usage under `eval-data/`.

- `dev.csv.gz`: Bitbrains VMs 1-125, July 2013 only (rows before 2013-08-01): every setting is chosen here.
- `judged.csv.gz`: Bitbrains VMs 126-250, July and August (their July is history only: the harness is run with
  `--first-decision 2013-08-01`), the half no setting was chosen on.
- `dev-august.csv.gz`: the development VMs 1-125 in July and August (July is history only, as for `judged`): the
  days after the ones settings were chosen on, for a check of a choice made on `dev` on later days of its VMs.
- `nab-cpu.csv.gz`: the CPU series of the NAB AWS CloudWatch set (8 EC2, 2 RDS, the autoscaling group) as one
  container each, `cpu_cores = percent / 100 x 4` (an assumed 4-core instance; only ratios matter), memory empty.

Usage: .venv/bin/python scripts/eval_data.py [--shared ../shared/data] [--out eval-data]
"""

from __future__ import annotations

import argparse
import pathlib
import sys

import pandas as pd

AUGUST_2013 = 1375315200  # 2013-08-01 00:00 UTC
ASSUMED_CORES = 4.0


def _vm_number(workload: pd.Series) -> pd.Series:
    return workload.str.removeprefix("vm-").astype(int)


def split_bitbrains(shared: pathlib.Path, out: pathlib.Path) -> None:
    usage = pd.read_csv(shared / "bitbrains-jul-aug" / "usage.csv.gz", engine="pyarrow")
    vm = _vm_number(usage["workload"])
    dev = usage[(vm <= 125) & (usage["timestamp"] < AUGUST_2013)]
    judged = usage[vm > 125]
    for name, frame in (("dev", dev), ("judged", judged), ("dev-august", usage[vm <= 125])):
        frame.to_csv(out / f"{name}.csv.gz", index=False, compression="gzip")
        print(f"{name}: {len(frame):,} rows, {frame['workload'].nunique()} VMs", file=sys.stderr)


def nab_cpu(shared: pathlib.Path, out: pathlib.Path) -> None:
    root = shared / "nab-aws-cloudwatch"
    files = sorted(
        [*root.glob("realAWSCloudwatch/*cpu_utilization*.csv"), *root.glob("realKnownCause/cpu_utilization*.csv")]
    )
    frames = []
    for path in files:
        raw = pd.read_csv(path)
        stamp = (pd.to_datetime(raw["timestamp"], utc=True) - pd.Timestamp(0, tz="UTC")) // pd.Timedelta(seconds=1)
        name = path.stem.replace("_", "-")
        frames.append(
            pd.DataFrame(
                {
                    "timestamp": stamp,
                    "namespace": "nab",
                    "workload": name,
                    "pod": name,
                    "container": "main",
                    "cpu_cores": raw["value"] / 100.0 * ASSUMED_CORES,
                    "memory_bytes": float("nan"),
                    "cpu_limit_cores": ASSUMED_CORES,
                }
            ).drop_duplicates("timestamp")
        )
    tidy = pd.concat(frames).sort_values(["namespace", "workload", "pod", "container", "timestamp"])
    tidy.to_csv(out / "nab-cpu.csv.gz", index=False, compression="gzip")
    print(f"nab-cpu: {len(tidy):,} rows, {len(files)} series", file=sys.stderr)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shared", type=pathlib.Path, default=pathlib.Path("../shared/data"))
    parser.add_argument("--out", type=pathlib.Path, default=pathlib.Path("eval-data"))
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    if not all((args.out / f"{name}.csv.gz").exists() for name in ("dev", "judged", "dev-august")):
        split_bitbrains(args.shared, args.out)
    nab_cpu(args.shared, args.out)


if __name__ == "__main__":
    main()
