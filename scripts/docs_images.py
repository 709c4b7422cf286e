"""Re-make the product pictures in docs/images/ from the demo (`make docs-images`), so none can show what the
product no longer shows: four-lines.png is the chart `recommender demo` draws; dashboard.png is the demo model's
workload page in the dashboard, served by `recommender serve` on loopback and shot by Debian's headless Chromium
through Playwright (as the browser tests drive it). Pictures of dated benchmark runs live in docs/images/results/
and come from their benchmark's command instead.

The demo writes to demo-output/docs-images/ (`--workdir`), the commands' output to docs-images.log there; every
wait is bounded.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

# The browser tests' own server and browser set-up: one way to start them.
from tests.integration.server import serving  # noqa: E402
from tests.support.browser import chromium  # noqa: E402

IMAGES = REPO / "docs" / "images"
RECOMMENDER = Path(sys.executable).with_name("recommender")
#: The workload whose page is shown: the bundled trace's job with the most pods.
WORKLOAD = "google-2019/job-399444405700"
WAIT_SECONDS = 60


def run(command: list[str], log: Path) -> None:
    """Run one step with its output appended to the log; a failure names the step and the log."""
    with log.open("a") as out:
        out.write(f"$ {' '.join(command)}\n")
        out.flush()
        done = subprocess.run(command, stdout=out, stderr=out, stdin=subprocess.DEVNULL, timeout=600, check=False)
    if done.returncode != 0:
        sys.exit(f"{command[1]} failed (exit {done.returncode}); its output is in {log}")


def dashboard_shot(store: Path, target: Path) -> None:
    """The workload page of the demo model, full page, 1400 pixels wide."""
    executable = shutil.which("chromium")
    if executable is None:
        sys.exit("chromium is not installed: scripts/install-test-deps.sh installs Debian's chromium")
    with serving(store, store.parent) as base, chromium(executable, WAIT_SECONDS * 1000) as browser:
        page = browser.new_page()
        route = f"workload/{WORKLOAD}"
        page.goto(f"{base}/ui/#/{route}")
        page.wait_for_selector(f'#view[data-ready=true][data-route="{route}"]')
        page.screenshot(path=str(target), full_page=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--workdir", type=Path, default=REPO / "demo-output" / "docs-images", help="Where the demo and the log go."
    )
    workdir: Path = parser.parse_args().workdir
    if workdir.exists():
        shutil.rmtree(workdir)  # a fresh demo: nothing of an older store may show
    workdir.mkdir(parents=True)
    log = workdir / "docs-images.log"
    print("docs-images: running the demo (training on the bundled trace)", file=sys.stderr)
    run([str(RECOMMENDER), "demo", "--no-serve", "--workdir", str(workdir)], log)
    shutil.copyfile(workdir / "four-lines.png", IMAGES / "four-lines.png")
    print("docs-images: shooting the dashboard's workload page", file=sys.stderr)
    dashboard_shot(workdir / "store", IMAGES / "dashboard.png")
    print(f"docs-images: wrote {IMAGES / 'four-lines.png'} and {IMAGES / 'dashboard.png'}", file=sys.stderr)


if __name__ == "__main__":
    os.environ.setdefault("COLUMNS", "160")  # the demo's table in the log, unwrapped
    main()
