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
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[1]
IMAGES = REPO / "docs" / "images"
RECOMMENDER = Path(sys.executable).with_name("recommender")
#: The workload whose page is shown: the bundled trace's job with the most pods.
WORKLOAD = "google-2019/job-399444405700"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking"]
WAIT_SECONDS = 60


def run(command: list[str], log: Path) -> None:
    """Run one step with its output appended to the log; a failure names the step and the log."""
    with log.open("a") as out:
        out.write(f"$ {' '.join(command)}\n")
        out.flush()
        done = subprocess.run(command, stdout=out, stderr=out, stdin=subprocess.DEVNULL, timeout=600, check=False)
    if done.returncode != 0:
        sys.exit(f"{command[1]} failed (exit {done.returncode}); its output is in {log}")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def wait_ready(url: str, server: subprocess.Popen[bytes], log: Path) -> None:
    """Wait until the server has a model loaded (bounded), or stop with where its output went."""
    deadline = time.monotonic() + WAIT_SECONDS
    while time.monotonic() < deadline:
        if server.poll() is not None:
            sys.exit(f"recommender serve exited with {server.returncode}; its output is in {log}")
        try:
            if httpx.get(url + "/readyz", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    sys.exit(f"recommender serve was not ready within {WAIT_SECONDS} s; its output is in {log}")


def dashboard_shot(store: Path, target: Path, log: Path) -> None:
    """The workload page of the demo model, full page, 1400 pixels wide."""
    chromium = shutil.which("chromium")
    if chromium is None:
        sys.exit("chromium is not installed: scripts/install-test-deps.sh installs Debian's chromium")
    from playwright.sync_api import sync_playwright

    port = free_port()
    base = f"http://127.0.0.1:{port}"
    command = [str(RECOMMENDER), "serve", "--store", str(store), "--host", "127.0.0.1", "--port", str(port)]
    with log.open("a") as out:
        server = subprocess.Popen(command, stdout=out, stderr=out, stdin=subprocess.DEVNULL)
    try:
        wait_ready(base, server, log)
        with tempfile.TemporaryDirectory() as profile, sync_playwright() as playwright:
            browser = playwright.chromium.launch_persistent_context(
                profile,
                executable_path=chromium,
                args=CHROMIUM_ARGS,
                headless=True,
                viewport={"width": 1400, "height": 1000},
            )
            browser.set_default_timeout(WAIT_SECONDS * 1000)
            try:
                page = browser.new_page()
                route = f"workload/{WORKLOAD}"
                page.goto(f"{base}/ui/#/{route}")
                page.wait_for_selector(f'#view[data-ready=true][data-route="{route}"]')
                page.screenshot(path=str(target), full_page=True)
            finally:
                browser.close()
    finally:
        server.terminate()
        try:
            server.wait(timeout=15)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait(timeout=15)


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
    dashboard_shot(workdir / "store", IMAGES / "dashboard.png", log)
    print(f"docs-images: wrote {IMAGES / 'four-lines.png'} and {IMAGES / 'dashboard.png'}", file=sys.stderr)


if __name__ == "__main__":
    os.environ.setdefault("COLUMNS", "160")  # the demo's table in the log, unwrapped
    main()
