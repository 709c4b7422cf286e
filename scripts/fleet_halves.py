"""How far a container's lines move when half of its fleet leaves (issue 39, item 13).

Two fleets of `--fleet-size` live Bitbrains VMs (drawn with `--seed`; the last `--days` days before each file's end:
August from `bitbrains-aug`, July from `bitbrains-jul-aug`), each recommended whole and then as its two random
halves, in this process by `recommend`'s own path (`pipelines.train.recommend_from_file`). Prints, per resource and
line, how many VM-halves moved by more than `--bound` from the whole fleet's value, and the median and p90 move.

    .venv/bin/python scripts/fleet_halves.py [--shared ../shared] [--seed 0] [--settings JSON] [--moves FILE]

The table's last columns: of the VM-halves that moved, how many had their line's candidate change (a choice flip, the
fleet's or its group's), and the median and p90 move over all 240.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from cli.settings import Settings  # noqa: E402
from pipelines.train import recommend_from_file  # noqa: E402

LINES = ("request", "short_term", "long_term")
#: (name, data folder, the fleet's end: the file's last sample, or this day's midnight UTC)
FLEETS = (("august", "bitbrains-aug", None), ("july", "bitbrains-jul-aug", "2013-08-01"))


def _settings(overrides: dict[str, object]) -> Settings:
    settings = Settings()
    if not overrides:
        return settings
    forecast = type(settings.forecast).model_validate({**settings.forecast.model_dump(), **overrides})
    return settings.model_copy(update={"forecast": forecast})


def _fleet(path: Path, end: str | None, days: int, size: int, rng: np.random.Generator) -> tuple[pd.DataFrame, int]:
    """The last `days` days before the end of `size` VMs drawn among those with a sample in its last day."""
    usage = pd.read_csv(path, engine="pyarrow")
    as_of = int(pd.Timestamp(end, tz="UTC").timestamp()) if end else int(usage["timestamp"].max()) + 1
    usage = usage[(usage["timestamp"] < as_of) & (usage["timestamp"] >= as_of - days * 86400)]
    live = np.sort(usage.loc[usage["timestamp"] >= as_of - 86400, "workload"].unique())
    chosen = rng.choice(live, size=size, replace=False)
    return usage[usage["workload"].isin(chosen)], as_of


def _lines(usage: pd.DataFrame, as_of: int, settings: Settings, folder: Path) -> pd.DataFrame:
    """(workload, resource, line) -> value of `recommend` on these rows."""
    path = folder / "usage.csv.gz"
    usage.sort_values(["namespace", "workload", "pod", "container", "timestamp"]).to_csv(path, index=False)
    result = recommend_from_file(path, as_of, 86400, settings)
    rows = []
    for rec in result.recommendations:
        for resource in ("cpu", "memory"):
            r = getattr(rec, resource)
            if r is None:
                continue
            values = {"request": r.target, "short_term": max(r.short_term), "long_term": r.long_term}
            for line in LINES:
                key = "target" if line == "request" else line
                # The candidate's name, without the container's cost and factor `describe` appends.
                model = (getattr(r.models, key, "") if r.models else "").split(" cost=")[0].split(" not yet")[0]
                quality = r.models.quality.get(key) if r.models else None
                factor = quality.calibration_factor if quality else np.nan
                rows.append((rec.workload, resource, line, float(values[line]), model, factor))
    columns = ["workload", "resource", "line", "value", "model", "factor"]
    return pd.DataFrame(rows, columns=columns).set_index(["workload", "resource", "line"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shared", type=Path, default=Path("/work/shared"))
    parser.add_argument("--fleet-size", type=int, default=120)
    parser.add_argument("--days", type=int, default=15)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--bound", type=float, default=0.10, help="a move beyond this share counts")
    parser.add_argument("--settings", default="{}", help="JSON of forecast settings laid over the defaults")
    parser.add_argument("--moves", type=Path, help="write every VM-half's values and move here (CSV)")
    args = parser.parse_args()
    settings, rng = _settings(json.loads(args.settings)), np.random.default_rng(args.seed)
    frames = []
    with tempfile.TemporaryDirectory() as tmp:
        for name, folder, end in FLEETS:
            usage, as_of = _fleet(args.shared / "data" / folder / "usage.csv.gz", end, args.days, args.fleet_size, rng)
            vms = np.array(sorted(usage["workload"].unique()))
            halves = np.array_split(rng.permutation(vms), 2)
            whole = _lines(usage, as_of, settings, Path(tmp))
            for h, half in enumerate(halves):
                part = _lines(usage[usage["workload"].isin(half)], as_of, settings, Path(tmp))
                both = part.add_suffix("_half").join(whole.add_suffix("_whole")).reset_index()
                both["fleet"], both["half_index"] = name, h
                frames.append(both)
            print(f"{name}: {len(vms)} VMs, as of {as_of}", file=sys.stderr)
    moves = pd.concat(frames, ignore_index=True)
    with np.errstate(divide="ignore", invalid="ignore"):
        moves["move"] = np.abs(moves["value_half"] / moves["value_whole"] - 1.0)
    moves.loc[(moves["value_half"] == 0) & (moves["value_whole"] == 0), "move"] = 0.0
    if args.moves:
        moves.to_csv(args.moves, index=False)
    print(f"| line | moved > {args.bound:.0%} | of them, model changed | median move | p90 move |")
    print("|---|---:|---:|---:|---:|")
    for (resource, line), group in moves.groupby(["resource", "line"], sort=False):
        move, flipped = group["move"].to_numpy(), (group["model_half"] != group["model_whole"]).to_numpy()
        moved = move > args.bound
        print(
            f"| {resource} {line} | {int(moved.sum())} of {len(move)} | {int((moved & flipped).sum())} | "
            f"{np.nanmedian(move):.1%} | {np.nanquantile(move, 0.9):.1%} |"
        )


if __name__ == "__main__":
    main()
