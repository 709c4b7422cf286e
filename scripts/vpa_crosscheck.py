"""Cross-check the `vpa` policy against VPA's own recommender code (v1.5.1, built from the Go module proxy).

    .venv/bin/python scripts/vpa_crosscheck.py [USAGE.csv.gz ...] [--workloads 30] [--days 31] [--ooms 20]

Builds `scripts/vpa_crosscheck/` (a small Go program that feeds tidy samples, in file order per pod, to VPA's
ContainerState / AggregateContainerState and asks its pod recommender), feeds the same samples to our `vpa` policy,
and prints per file how many workload containers agree on all six values (CPU and memory target, lower and upper
bound, in millicores and bytes) and the largest difference. Needs Go and the Go module proxy (first build).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import pandas as pd

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from models.pods import with_group_labels  # noqa: E402
from models.workload import vpa_estimator  # noqa: E402
from recommender.settings import HistogramSettings, PolicySettings  # noqa: E402


def oom_kills(usage: pd.DataFrame, count: int) -> pd.DataFrame:
    """`count` OOM kills at sample times spread over the file, each with a request of 1.5x the pod's usage then."""
    rows = usage.iloc[:: max(len(usage) // max(count, 1), 1)].head(count)
    return pd.DataFrame(
        {
            "group": rows["group"],
            "pod": rows["pod"],
            "timestamp": rows["timestamp"],
            "request_bytes": (rows["memory_bytes"].fillna(1e8) * 1.5).round(),
        }
    )


def feed(usage: pd.DataFrame, ooms: pd.DataFrame) -> str:
    """The samples and OOM kills as the Go program reads them, per pod in time order (a kill after the samples of
    its second, as our estimator orders them)."""
    samples = usage.assign(kind=0)[["group", "pod", "timestamp", "kind", "cpu_cores", "memory_bytes"]]
    kills = ooms.assign(kind=1, cpu_cores=float("nan")).rename(columns={"request_bytes": "memory_bytes"})
    both = pd.concat([samples, kills[samples.columns]]).sort_values(
        ["group", "pod", "timestamp", "kind"], kind="stable"
    )
    lines = []
    for g, p, t, kind, c, m in zip(*(both[c].tolist() for c in both.columns)):
        if kind:
            lines.append(f"{g}\t{p}\t{int(t)}\t-\t{int(m)}\toom\n")
        else:
            lines.append(f"{g}\t{p}\t{int(t)}\t{'' if c != c else repr(c)}\t{'' if m != m else repr(m)}\n")
    return "".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("files", nargs="*", default=[str(HERE.parent / "data" / "google-2019" / "usage.csv.gz")])
    parser.add_argument("--workloads", type=int, default=30, help="first N workloads of each file")
    parser.add_argument("--days", type=float, default=31.0, help="first N days of each file")
    parser.add_argument("--ooms", type=int, default=20, help="OOM kills spread over each file (0: none)")
    args = parser.parse_args()
    binary = HERE / "vpa_crosscheck" / "vpa-crosscheck"
    print("building VPA's recommender (Go)...", file=sys.stderr)
    subprocess.run(["go", "build", "-o", str(binary), "."], cwd=HERE / "vpa_crosscheck", check=True)
    for path in args.files:
        usage = pd.read_csv(path, engine="pyarrow")
        keep = usage["workload"].isin(sorted(usage["workload"].unique())[: args.workloads])
        usage = usage[keep & (usage["timestamp"] < usage["timestamp"].min() + args.days * 86400)]
        usage = with_group_labels(
            usage.sort_values(["namespace", "workload", "pod", "container", "timestamp"], kind="stable")
        )
        usage = usage.assign(group=usage["group"].astype(str))
        print(f"{path}: {len(usage)} samples, {usage['group'].nunique()} workload containers", file=sys.stderr)
        ooms = oom_kills(usage, args.ooms)
        upstream = json.loads(
            subprocess.run([str(binary)], input=feed(usage, ooms), capture_output=True, text=True, check=True).stdout
        )
        ours = vpa_estimator(HistogramSettings(), PolicySettings()).fit(usage, oom_events=ooms)
        agree, worst = 0, 0
        for group, theirs in sorted(upstream.items()):
            found = ours.recommend(
                group, 1, float(ours.states_[group].last_sample or 0)
            )  # VPA's test feed never expires
            assert found is not None
            mine = [
                found[0].target,
                found[0].lower_bound,
                found[0].upper_bound,
                found[1].target,
                found[1].lower_bound,
                found[1].upper_bound,
            ]
            worst = max(worst, *(abs(a - b) for a, b in zip(mine, theirs)))
            agree += mine == theirs
            if mine != theirs:
                print(f"  differs: {group}: ours {mine}, VPA {theirs}")
        print(
            f"{Path(path).parent.name}: {agree} of {len(upstream)} workload containers equal on all six values; largest difference {worst}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
