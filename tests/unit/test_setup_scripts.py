"""The Go build scripts' set-up messages: a Go too old to build says so with where to get a newer one (exit 3, as a
missing Go), and a failing step names the log it wrote and shows its end, instead of a wall of `go` output.
A stand-in `go` on PATH plays each case; nothing is downloaded."""

from __future__ import annotations

import stat
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def fake_go(directory: Path, version: str, download_error: str = "") -> Path:
    """A `go` that reports `version` and fails every other command with `download_error` on stderr."""
    directory.mkdir(parents=True, exist_ok=True)
    go = directory / "go"
    go.write_text(
        "#!/bin/sh\n"
        f'if [ "$1" = env ] && [ "$2" = GOVERSION ]; then echo go{version}; exit 0; fi\n'
        f'echo "{download_error}" >&2\nexit 1\n'
    )
    go.chmod(go.stat().st_mode | stat.S_IXUSR)
    return directory


def run_script(name: str, tmp_path: Path, go_dir: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", str(REPO / "scripts" / name)],
        capture_output=True,
        text=True,
        timeout=60,
        stdin=subprocess.DEVNULL,
        env={"PATH": f"{go_dir}:/usr/bin:/bin", "HOME": str(tmp_path), "KOORD_E2E_CACHE": str(tmp_path / "cache")},
    )


@pytest.mark.parametrize(("script", "needed"), [("build-helm.sh", "1.26"), ("build-control-plane.sh", "1.24")])
def test_debians_old_go_is_refused_with_where_to_get_a_newer_one(script: str, needed: str, tmp_path: Path) -> None:
    done = run_script(script, tmp_path, fake_go(tmp_path / "bin", "1.19.8"))
    assert done.returncode == 3, done.stderr
    (line,) = done.stderr.strip().splitlines()
    assert line.startswith(f"Go 1.19.8 is too old: install Go >= {needed} from https://go.dev/dl/"), line


def test_a_failing_step_names_its_log_and_shows_its_end(tmp_path: Path) -> None:
    done = run_script("build-helm.sh", tmp_path, fake_go(tmp_path / "bin", "1.26.0", "proxy said no: 410 Gone"))
    assert done.returncode != 0
    (log,) = (tmp_path / "cache").glob("helm-v*/build.log")
    assert f"the whole log is {log}" in done.stderr, done.stderr
    assert "proxy said no: 410 Gone" in done.stderr and "proxy said no" in log.read_text()
    assert len(done.stderr.splitlines()) <= 30  # a progress line, the failure, the log's end: no wall
