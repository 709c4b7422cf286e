"""Images that fit their role: serving imports none of the training, Dask or plotting libraries, a command or route
whose extra is missing says which to install, and the Dockerfile's roles are the extras the chart's images use."""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import yaml

from cli.main import bundled_dataset
from recommender.errors import EXTRA_OF_MODULE

REPO = Path(__file__).resolve().parents[2]
HEAVY = {"pandas", "sklearn", "scipy", "pyarrow", "matplotlib", "dask", "distributed", "statsmodels", "tenacity"}


def run_python(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=REPO)


def extras() -> dict[str, list[str]]:
    optional: dict[str, list[str]] = tomllib.loads((REPO / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]
    return optional


def test_the_serving_role_imports_no_training_dask_or_plotting_library() -> None:
    loaded = run_python(
        "import sys, serving.app, serving.controllers.status, serving.controllers.cluster_view, serving.controllers.nodes, cli.main;"
        "app = serving.app.create_app(__import__('cli.settings', fromlist=['Settings']).Settings());"
        "print(' '.join(sorted({m.split('.')[0] for m in sys.modules})))"
    )
    assert loaded.returncode == 0, loaded.stderr
    assert not HEAVY & set(loaded.stdout.split()), "serving imported " + ", ".join(
        sorted(HEAVY & set(loaded.stdout.split()))
    )


def test_every_heavy_library_belongs_to_an_extra_that_declares_it() -> None:
    declared = extras()
    names = {extra: " ".join(requirements) for extra, requirements in declared.items()}
    for module, extra in EXTRA_OF_MODULE.items():
        # Import names as distributions: scipy comes with scikit-learn.
        distribution = {"sklearn": "scikit-learn", "scipy": "scikit-learn"}.get(module, module.replace("_", "-"))
        assert re.search(rf"(^|\s){re.escape(distribution)}[>=\[]", names[extra]), f"{module}: not in the {extra} extra"
    core = " ".join(tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"])
    assert not any(
        re.search(rf"(^|\s){m}[>=]", core)
        for m in ("pandas", "scikit-learn", "pyarrow", "matplotlib", "dask", "statsmodels", "fastapi")
    )


@pytest.mark.parametrize(
    ("blocked", "command", "message"),
    [
        (
            "pyarrow",
            ["train", "--input", "usage.csv"],
            "recommender train needs pyarrow, which is not installed here: pip install 'koord-recommender[train]'",
        ),
        (
            "pandas",
            ["demo", "--no-serve"],
            "recommender demo needs pandas, which is not installed here: pip install 'koord-recommender[all]'",
        ),
        (
            "fastapi",
            ["serve"],
            "recommender serve needs fastapi, which is not installed here: pip install 'koord-recommender[serve]'",
        ),
    ],
)
def test_a_command_without_its_extra_says_which_to_install(blocked: str, command: list[str], message: str) -> None:
    ran = run_python(
        f"import sys; sys.modules[{blocked!r}] = None; sys.argv = ['recommender', *{command!r}];"
        "from cli.main import main; main()"
    )
    assert ran.returncode == 2, ran.stderr
    assert ran.stderr.strip().splitlines() == [f"error: {message}"]


def test_a_chart_route_without_matplotlib_answers_501_naming_the_extra(tmp_path: Path) -> None:
    from tests.conftest import entry_point, make_usage

    make_usage(workloads=1, days=2).to_csv(tmp_path / "usage.csv", index=False)
    trained = subprocess.run(
        [entry_point(), "train", "--input", str(tmp_path / "usage.csv"), "--store", str(tmp_path / "store")],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert trained.returncode == 0, trained.stderr
    ran = run_python(
        "import sys; sys.modules['matplotlib'] = None\n"
        "from fastapi.testclient import TestClient\n"
        "from cli.settings import Settings\n"
        "from serving.app import create_app\n"
        f"settings = Settings(store={{'path': {str(tmp_path / 'store')!r}}})\n"
        "with TestClient(create_app(settings)) as client:\n"
        "    lines = client.get('/api/v1/recommendations/ns/w0/main/lines')\n"
        "    chart = client.get('/api/v1/recommendations/ns/w0/main/chart.png')\n"
        "print(lines.status_code, chart.status_code, chart.json()['detail'])\n"
    )
    assert ran.returncode == 0, ran.stderr
    assert (
        ran.stdout.strip()
        == "200 501 chart.png needs matplotlib, which is not installed here: pip install 'koord-recommender[charts]'"
    )


def test_the_dockerfile_builds_one_image_per_role_from_a_pinned_base() -> None:
    dockerfile = (REPO / "Dockerfile").read_text()
    roles = re.findall(r"^#   ROLE=(\w+)", dockerfile, re.M)
    assert roles == ["serve", "train", "dask", "all"] and set(roles) <= set(extras())
    assert re.search(r'pip install [^\n]*"\.\[\$\{ROLE\}\]"', dockerfile)
    (base,) = re.findall(r"^ARG BASE=(\S+)", dockerfile, re.M)
    assert re.fullmatch(r"python:3\.11-slim-bookworm@sha256:[0-9a-f]{64}", base)
    assert re.findall(r"^FROM (\S+)", dockerfile, re.M) == ["${BASE}", "${BASE}"]
    assert "USER 10001:10001" in dockerfile
    values = yaml.safe_load((REPO / "manifests" / "chart" / "koord-recommender" / "values.yaml").read_text())
    assert set(values["images"]) - {"pullPolicy"} <= set(roles)
    assert values["podSecurityContext"]["runAsUser"] == 10001


def test_the_image_puts_the_demo_data_where_an_install_finds_it() -> None:
    dockerfile = (REPO / "Dockerfile").read_text()
    (source, target) = re.findall(r"^COPY (data/google-2019) (\S+)", dockerfile, re.M)[0]
    assert target == "/usr/local/share/koord-recommender/google-2019"  # sys.prefix of the image's Python is /usr/local
    assert (REPO / source / "usage.csv.gz").exists() and bundled_dataset() == REPO / source / "usage.csv.gz"
    located = run_python(
        "import sys, pathlib, tempfile, cli.main as cli\n"
        "prefix = pathlib.Path(tempfile.mkdtemp()); data = prefix / 'share/koord-recommender/google-2019'\n"
        "data.mkdir(parents=True); (data / 'usage.csv.gz').write_bytes(b'x'); sys.prefix = str(prefix)\n"
        "cli.__file__ = str(prefix / 'lib/site-packages/cli/main.py')\n"
        "print(cli.bundled_dataset() == data / 'usage.csv.gz')"
    )
    assert located.stdout.strip() == "True", located.stderr
