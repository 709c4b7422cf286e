"""The web dashboard in a real browser: Debian's headless Chromium driven by Playwright against `recommender serve`
on loopback over a model trained on the bundled Google 2019 trace. Screenshots go to test-artifacts/dashboard/.

One service per module for the pages that read data; the token and no-model states start their own small ones.
Every wait is bounded (Playwright's timeouts). Chromium comes from scripts/install-test-deps.sh; without it the
browser tests are skipped with that message (the REST tests still run).
"""

from __future__ import annotations

import csv
import io
import json
import math
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from recommender.units import cpu_on_grid, cpu_quantity, memory_quantity
from tests.conftest import BUNDLED, DAY, REPO, entry_point, make_usage
from tests.integration.server import serving
from tests.support.browser import chromium

pytestmark = [pytest.mark.integration, pytest.mark.slow]

ARTIFACTS = REPO / "test-artifacts" / "dashboard"
WAIT_MS = 15_000
#: Two bundled workloads placed on one node, for the node page.
PODS_ON_NODE = [("job-113812204462", "job-113812204462-0"), ("job-380263806889", "job-380263806889-3")]


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A model store trained on the bundled trace, and the cluster files of one node running two of its pods."""
    directory = tmp_path_factory.mktemp("dashboard")
    trained = subprocess.run(
        [entry_point(), "train", "--input", str(BUNDLED), "--store", "store"],
        cwd=directory,
        capture_output=True,
        text=True,
        timeout=300,
        stdin=subprocess.DEVNULL,
    )
    assert trained.returncode == 0, trained.stderr
    nodes = {"items": [{"metadata": {"name": "node-a"}, "status": {"allocatable": {"cpu": "16", "memory": "64Gi"}}}]}
    pods = {
        "items": [
            {
                "metadata": {"namespace": "google-2019", "name": name, "generateName": workload + "-"},
                "spec": {
                    "nodeName": "node-a",
                    "containers": [{"name": "main", "resources": {"requests": {"cpu": "1", "memory": "1Gi"}}}],
                },
                "status": {"phase": "Running"},
            }
            for workload, name in PODS_ON_NODE
        ]
    }
    (directory / "nodes.json").write_text(json.dumps(nodes))
    (directory / "pods.json").write_text(json.dumps(pods))
    return directory


@pytest.fixture(scope="module")
def base(workdir: Path) -> Iterator[str]:
    env = {
        "KOORD_RECOMMENDER_EXTENDER__PODS_FILE": str(workdir / "pods.json"),
        "KOORD_RECOMMENDER_EXTENDER__NODES_FILE": str(workdir / "nodes.json"),
    }
    with serving(Path("store"), workdir, env=env) as url:
        yield url


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    """A Chromium context with a fresh profile; skipped only when Debian's chromium is not installed."""
    executable = shutil.which("chromium")
    if executable is None:
        pytest.skip("chromium is not installed (scripts/install-test-deps.sh installs Debian's chromium)")
    with chromium(executable, WAIT_MS) as context:
        yield context


@pytest.fixture
def page(browser: Any) -> Iterator[Any]:
    page = browser.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda error: errors.append(str(error)))
    yield page
    page.close()
    assert errors == [], f"JavaScript errors: {errors}"


def shot(page: Any, name: str) -> None:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / f"{name}.png"), full_page=True)


def open_view(page: Any, url: str) -> None:
    page.goto(url)
    page.wait_for_selector("#view[data-ready=true]")


def wait_for_view(page: Any, route: str) -> None:
    """Wait until the page at `route` (the hash after '#') is drawn, not the one a click is leaving: the browser
    changes the URL before it dispatches the hash change, so the old view can still say it is ready."""
    page.wait_for_url("**/ui/#" + route)
    page.wait_for_selector(f'#view[data-ready=true][data-route="{route.lstrip("/")}"]')


# ---- REST reads made for the dashboard -----------------------------------------------------------------------------


def test_root_redirects_to_the_dashboard_and_its_files_are_served(base: str) -> None:
    root = httpx.get(base + "/", timeout=10)
    assert root.status_code == 307 and root.headers["location"] == "/ui/"
    page = httpx.get(base + "/ui/", timeout=10)
    assert page.status_code == 200 and "app.js" in page.text
    script = httpx.get(base + "/ui/app.js", timeout=10)
    assert script.status_code == 200 and "javascript" in script.headers["content-type"]
    # Nothing is loaded from elsewhere (clusters are often offline): the only URL is the SVG namespace.
    assert "http" not in page.text and "http" not in script.text.replace('"http://www.w3.org/2000/svg"', "")


def test_show_and_the_dashboard_agree_on_the_savings(base: str, workdir: Path) -> None:
    """One computation for both: the dashboard's overview and `show --format json` on the same store."""
    shown = subprocess.run(
        [entry_point(), "show", "--store", "store", "--format", "json"],
        cwd=workdir,
        capture_output=True,
        text=True,
        timeout=60,
        stdin=subprocess.DEVNULL,
    )
    assert shown.returncode == 0, shown.stderr
    ours = json.loads(shown.stdout)["overview"]
    dashboard = httpx.get(base + "/api/v1/overview", timeout=10).json()
    assert ours["cluster"] == dashboard["cluster"] and ours["namespaces"] == dashboard["namespaces"]
    assert ours["workloads"] == dashboard["workloads"]
    # The bundled trace sets limits only: the request is the limit, the memory totals are not zero.
    assert (
        dashboard["cluster"]["memory_request_bytes"] > 10 * 2**30
        and dashboard["cluster"]["cpu_request_cores_all_replicas"] > 0
    )


def test_status_and_overview(base: str) -> None:
    status = httpx.get(base + "/api/v1/status", timeout=10).json()
    recommendations = httpx.get(base + "/api/v1/recommendations", timeout=10).json()
    assert status["version"] == recommendations["version"]
    assert status["as_of"] == recommendations["as_of"]
    assert status["stale"] is True and status["age_seconds"] > 6 * 365 * 86400  # the trace is from 2019
    overview = httpx.get(base + "/api/v1/overview", timeout=10)
    body = overview.json()
    assert len(body["workloads"]) == len(recommendations["recommendations"]) == 4
    first = recommendations["recommendations"][0]
    row = next(w for w in body["workloads"] if w["workload"] == first["workload"])
    # The trace has limits only: the request defaults to the limit, so the pods are Guaranteed (LSR, koord-prod).
    assert row["cpu_cores"]["current_request"] == first["current"]["cpu_limit_cores"]
    written = cpu_on_grid(first["cpu"]["target"])
    assert row["cpu_cores"]["change"] == pytest.approx(written - first["current"]["cpu_limit_cores"])
    assert (row["kubernetes_qos"], row["qos_class"], row["priority_class"]) == ("Guaranteed", "LSR", "koord-prod")
    assert body["cluster"]["cpu_request_cores"] == pytest.approx(
        sum(r["current"]["cpu_limit_cores"] for r in recommendations["recommendations"])
    )
    assert list(body["namespaces"]) == ["google-2019"]
    again = httpx.get(base + "/api/v1/overview", headers={"If-None-Match": overview.headers["etag"]}, timeout=10)
    assert again.status_code == 304


# ---- the pages in Chromium -----------------------------------------------------------------------------------------


def test_overview_lists_the_workloads_and_filters_change_the_list(page: Any, base: str) -> None:
    overview = httpx.get(base + "/api/v1/overview", timeout=10).json()
    open_view(page, base + "/")
    assert page.url.startswith(base + "/ui/")
    rows = page.locator("[data-testid=workload-rows] tr[data-workload]")
    assert rows.count() == len(overview["workloads"]) == 4
    shown = {rows.nth(i).get_attribute("data-workload") for i in range(rows.count())}
    assert shown == {f"{w['namespace']}/{w['workload']}/{w['container']}" for w in overview["workloads"]}
    # Sorted by CPU that would be freed, most first.
    freed = [
        next(
            w
            for w in overview["workloads"]
            if f"{w['namespace']}/{w['workload']}/{w['container']}" == rows.nth(i).get_attribute("data-workload")
        )["cpu_cores"]["change"]
        for i in range(4)
    ]
    assert freed == sorted(freed)  # the most negative change first
    assert page.locator("#banner[data-kind=stale]").is_visible()  # the 2019 trace is years old
    assert "4 of 4" in page.locator("[data-testid=row-count]").inner_text()
    shot(page, "overview")

    target = overview["workloads"][2]["workload"]
    page.fill("input[name=q]", target[-6:])
    assert rows.count() == 1 and target in rows.first.get_attribute("data-workload")
    assert "1 of 4" in page.locator("[data-testid=row-count]").inner_text()
    page.reload()  # the filters live in the URL, so a reload or a shared link keeps them
    page.wait_for_selector("#view[data-ready=true]")
    assert rows.count() == 1 and page.input_value("input[name=q]") == target[-6:]
    page.fill("input[name=q]", "no-such-workload")
    assert rows.count() == 0 and page.locator("[data-testid=state-no-match]").is_visible()
    page.fill("input[name=q]", "")
    page.select_option("select[name=namespace]", "google-2019")
    page.select_option("select[name=priority]", "koord-prod")
    assert rows.count() == 4
    page.check("input[name=risky]")
    assert rows.count() == sum(1 for w in overview["workloads"] if w["risks"])
    page.select_option("select[name=sort]", "name")
    names = [rows.nth(i).get_attribute("data-workload") for i in range(rows.count())]
    assert names == sorted(names)


def test_a_click_opens_the_workload_page_with_its_charts(page: Any, base: str) -> None:
    # The workload with the longest history: every line of it has been backtested (and it makes the best screenshot).
    listed = httpx.get(base + "/api/v1/recommendations", timeout=10).json()["recommendations"]
    busiest = max(listed, key=lambda r: r["history"]["samples"])
    namespace, workload = busiest["namespace"], busiest["workload"]
    open_view(page, base + "/ui/")
    page.locator(
        f"[data-testid=workload-rows] tr[data-workload='{namespace}/{workload}/{busiest['container']}'] a"
    ).click()
    wait_for_view(page, f"/workload/{namespace}/{workload}")
    rec = httpx.get(f"{base}/api/v1/recommendations/{namespace}/{workload}", timeout=10).json()[0]
    charts = page.locator("[data-testid=chart] svg")
    assert charts.count() == 2
    for i in range(2):
        svg = charts.nth(i)
        box = svg.bounding_box()
        assert box is not None and box["width"] > 300 and box["height"] > 100
        for series in ("usage", "short_term", "long_term", "target", "limit"):
            path = svg.locator(f"path[data-series={series}]")
            assert path.count() == 1, series
            assert len(path.get_attribute("d") or "") > 10, series
        # The usage line has a point per observed step (one move or line command each).
        usage = svg.locator("path[data-series=usage]").get_attribute("d") or ""
        assert usage.count("L") + usage.count("M") == sum(
            v is not None for v in rec["history"]["recent_cpu_cores" if i == 0 else "recent_memory_bytes"]
        )
        colors = {
            s: svg.locator(f"path[data-series={s}]").get_attribute("stroke")
            for s in ("limit", "usage", "short_term", "long_term")
        }
        assert colors == {"limit": "#8c8c8c", "usage": "#d62728", "short_term": "#08306b", "long_term": "#6baed6"}
        # The learned live line over its block (the next step), where it serves the container (the busiest one has
        # the history for it), with a dot at its start: five minutes are a sliver of the chart.
        live = rec["cpu" if i == 0 else "memory"]["live_short_term"]
        assert live is not None and live["until"] - live["issued_at"] == 300
        drawn = svg.locator("path[data-series=live_short_term]")
        assert drawn.count() == 1 and drawn.get_attribute("stroke") == "#ff7f0e"
        assert svg.locator("circle[data-series=live_short_term-marker]").count() == 1
        svg.hover(
            position={"x": box["width"] * 0.3, "y": box["height"] / 2}
        )  # in the observed day: the values read off
        assert "usage" in page.locator(".readout").nth(i).inner_text()
    # The snippet is YAML of a pod template with the service's own quantities (the trace has no kind: a Deployment's path).
    snippet = yaml.safe_load(page.locator("[data-testid=yaml]").inner_text())
    container = snippet["spec"]["template"]["spec"]["containers"][0]
    assert container["name"] == rec["container"]
    assert str(container["resources"]["requests"]["cpu"]) == cpu_quantity(rec["cpu"]["target"])
    assert str(container["resources"]["requests"]["memory"]) == memory_quantity(rec["memory"]["target"])
    # Only limits are set in the trace, so the request defaulted to the limit and the scaled limit is the target,
    # unless the window's CPU peak is higher (a limit never throttles usage the container reached).
    expected_limit = max(rec["cpu"]["target"], rec["cpu"]["limit_floor"] or 0.0)
    assert str(container["resources"]["limits"]["cpu"]) == cpu_quantity(expected_limit)
    models = page.locator("[data-testid=models]").inner_text()
    quality = rec["cpu"]["models"]["quality"]["short_term"]
    assert (
        quality["cost"] is not None
        and f"{quality['cost']:.3g}" in models
        and f"{quality['next_best_cost']:.3g}" in models
    )
    chosen = rec["cpu"]["models"]["short_term"].split(" ")[0]
    assert chosen in models and "cost=" not in models
    recommendation = page.locator("[data-testid=recommendation]").inner_text()
    assert "upper bound" in recommendation and "lower bound" in recommendation
    assert "ceiling: max(limit, highest sample)" in recommendation
    # Each line the usage ceiling touched, with its rule (issue 39: held under max(limit, highest sample)).
    rules = [rule for r in ("cpu", "memory") for rule in rec[r]["ceiling_rules"].values()]
    listed = page.locator("[data-testid=ceiling-rules]")
    assert listed.count() == (1 if rules else 0)
    assert all(rule in listed.inner_text() for rule in rules)
    shot(page, "workload")
    page.goto(base + "/ui/#/workload/google-2019/no-such-job")
    wait_for_view(page, "/workload/google-2019/no-such-job")
    assert "no-such-job" in page.locator("[data-testid=state-not-found]").inner_text()


def test_node_page_draws_its_lines_and_what_the_api_adds(page: Any, base: str) -> None:
    nodes = httpx.get(base + "/api/v1/nodes", timeout=10).json()
    lines = httpx.get(base + "/api/v1/nodes/node-a/lines", timeout=10).json()
    open_view(page, base + "/ui/#/nodes")
    links = page.locator("[data-testid=nodes] a")
    assert links.count() == len(nodes) == 1
    links.first.click()
    wait_for_view(page, "/node/node-a")
    charts = page.locator("[data-testid=chart] svg")
    assert charts.count() == 2
    for i, resource in enumerate(("cpu_cores", "memory_bytes")):
        svg = charts.nth(i)
        assert len(svg.locator("path[data-series=short_term]").get_attribute("d") or "") > 10
        assert svg.locator("path[data-series=allocatable]").count() == 1
        # Lines the node API may add (limit, usage, long-term reservation, system usage) are drawn when present.
        for key, series in (
            ("limit", "limit"),
            ("usage", "usage"),
            ("long_term_reservation", "long_term"),
            ("system_usage", "system"),
        ):
            value = lines[resource].get(key)
            present = value is not None and value != []
            assert svg.locator(f"path[data-series={series}]").count() == (1 if present else 0), key
    if "pods" in lines:
        rows = page.locator("[data-testid=pods] tbody tr")
        assert rows.count() == len(lines["pods"]) == len(PODS_ON_NODE)
    if lines["cpu_cores"].get("reclaimable"):
        assert page.locator("[data-testid=reclaimable]").is_visible()
    shot(page, "node")


# ---- a stale container on every surface (issue 39, item 4) ----------------------------------------------------------


def run(*args: str, cwd: Path) -> str:
    """The real CLI's output (a wide terminal, so a table row is one line)."""
    done = subprocess.run(
        [entry_point(), *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=300,
        stdin=subprocess.DEVNULL,
        env={**os.environ, "COLUMNS": "300"},
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


@pytest.fixture(scope="module")
def stale_workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A store where w2 stopped 5 days before the decision time (stale after 3), beside two live workloads. Its
    current CPU request is set (4 cores), far above what its history would be sized at."""
    directory = tmp_path_factory.mktemp("stale")
    usage = make_usage(workloads=3, pods=2, days=9)
    end = int(usage["timestamp"].max())
    gone = usage["workload"] == "w2"
    usage = usage[~gone | (usage["timestamp"] < end - 5 * DAY)].assign(
        cpu_request_cores=lambda u: u["workload"].map({"w0": 1.0, "w1": 2.0, "w2": 4.0})
    )
    usage.to_csv(directory / "usage.csv", index=False)
    run("train", "--input", "usage.csv", "--store", "store", "--as-of", str(end + 1), cwd=directory)
    return directory


def test_a_stale_container_is_marked_and_left_out_of_the_totals_of_show_and_the_api(stale_workdir: Path) -> None:
    """The page said "Stale" while `show` and the overview counted its savings. JSON, CSV, the table, the HTML report
    and the server's overview mark it and sum only the live containers; its lines hold its current request flat."""
    shown = json.loads(run("show", "--store", "store", "--format", "json", cwd=stale_workdir))
    rec = next(r for r in shown["recommendations"] if r["workload"] == "w2")
    for resource in ("cpu", "memory"):
        assert rec[resource]["stale"] and rec[resource]["peak"]["at"] is None
    assert set(rec["cpu"]["short_term"]) == {rec["cpu"]["long_term"]} == {4.0}  # the request it asked for
    assert rec["cpu"]["models"]["short_term"] == "stale: the current request held flat"
    rows = {w["workload"]: w for w in shown["overview"]["workloads"]}
    assert rows["w2"]["stale"] and rows["w2"]["cpu_cores"]["stale"] and not rows["w0"]["stale"]
    live = [rows["w0"], rows["w1"]]
    cluster = shown["overview"]["cluster"]
    assert cluster["stale"] == 1 and shown["overview"]["namespaces"]["ns"]["stale"] == 1
    for resource, unit in (("cpu", "cores"), ("memory", "bytes")):
        key = f"{resource}_{unit}"
        assert cluster[f"{resource}_request_{unit}"] == pytest.approx(sum(r[key]["current_request"] for r in live))
        assert cluster[f"{resource}_recommended_{unit}"] == pytest.approx(sum(r[key]["recommended"] for r in live))
    with serving(Path("store"), stale_workdir) as base:
        assert httpx.get(base + "/api/v1/overview", timeout=10).json() == shown["overview"]
    table = run("show", "--store", "store", cwd=stale_workdir)
    stale_row = next(line for line in table.splitlines() if "ns/w2" in line)
    # The caption wraps at the table's width: read it without the whitespace.
    assert stale_row.count("stale") == 4 and "1stale(nosamplesfordays:leftoutofthesesums)" in "".join(table.split())
    csv_rows = list(csv.DictReader(io.StringIO(run("show", "--store", "store", "--format", "csv", cwd=stale_workdir))))
    assert {r["workload"]: r["stale"] for r in csv_rows} == {"w0": "", "w1": "", "w2": "cpu; memory"}
    html = run("show", "--store", "store", "--format", "html", cwd=stale_workdir)
    assert "1 stale (no samples for days: left out of these sums)" in html


def test_a_stale_page_shows_what_it_says(page: Any, stale_workdir: Path) -> None:
    """The overview marks the row and says the totals leave it out; the workload page says the lines hold the
    current request and draws them there; it claims no risk level and no peak time for lines it did not forecast."""
    with serving(
        Path("store"), stale_workdir, env={"KOORD_RECOMMENDER_SERVE__STALE_MODEL_AGE_SECONDS": "10000000000"}
    ) as base:
        open_view(page, base + "/ui/")
        row = page.locator("[data-testid=workload-rows] tr[data-workload='ns/w2/main']")
        assert row.get_attribute("data-stale") == "true" and row.locator("[data-testid=stale-tag]").is_visible()
        assert row.locator("[data-testid=stale-change]").count() == 2
        assert "1 stale, left out of these sums" in page.locator("[data-testid=totals-detail]").inner_text()
        open_view(page, base + "/ui/#/workload/ns/w2")
        said = page.locator("[data-testid=stale-recommendation]").inner_text()
        assert "CPU: the current request held flat; memory: the current request (its limit) held flat" in said
        assert "the totals leave it out" in said
        recommendation = page.locator("[data-testid=recommendation]").inner_text()
        assert "none: no forecast (stale)" in recommendation and "1.0 %" not in recommendation
        assert "no single time: highest from now on" in recommendation
        # The short-term line is drawn at the 4-core request: the top tick is the round step just above it.
        ticks = page.locator("[data-testid=chart] svg").first.locator("text[data-tick]")
        values = [float(ticks.nth(i).get_attribute("data-tick") or "nan") for i in range(ticks.count())]
        assert values[0] == 0 and values[-1] >= 4.0 and round_steps(values)
        assert [ticks.nth(i).text_content() for i in range(ticks.count())] == [f"{v:g}" for v in values]
        shot(page, "stale-workload")


def round_steps(values: list[float]) -> bool:
    """Ticks from 0 at one step of 1, 2 or 5 times a power of ten."""
    step = values[1] - values[0]
    mantissa = step / 10 ** math.floor(math.log10(step) + 1e-9)
    return any(math.isclose(mantissa, m) for m in (1, 2, 5)) and all(
        math.isclose(v, i * step, abs_tol=step * 1e-9) for i, v in enumerate(values)
    )


def test_token_is_asked_for_kept_for_the_tab_and_sent(page: Any, workdir: Path) -> None:
    (workdir / "token").write_text("s3cret\n")
    env = {
        "KOORD_RECOMMENDER_AUTH__TOKEN_FILE": str(workdir / "token"),
        "KOORD_RECOMMENDER_SERVE__STALE_MODEL_AGE_SECONDS": str(10**10),
    }
    with serving(Path("store"), workdir, env=env) as url:
        open_view(page, url + "/ui/")
        assert page.locator("[data-testid=state-unauthorized]").is_visible()
        assert page.locator("#token-form").is_visible()
        page.fill("#token-input", "wrong")
        page.click("#token-form button[type=submit]")
        page.wait_for_selector("#view[data-ready=true]")
        assert "refused" in page.locator("[data-testid=state-unauthorized]").inner_text()
        page.fill("#token-input", "s3cret")
        page.click("#token-form button[type=submit]")
        page.wait_for_selector("#view[data-ready=true]")
        assert page.locator("[data-testid=workload-rows] tr[data-workload]").count() == 4
        assert page.evaluate("sessionStorage.getItem('koord-recommender.token')") == "s3cret"
        assert page.locator("#token-form").is_hidden()
        assert page.locator("#banner").is_hidden()  # a model younger than the stale age: no warning
        assert page.locator("#model-status").get_attribute("data-state") == "fresh"


def test_no_model_is_a_clear_state(page: Any, tmp_path: Path) -> None:
    with serving(tmp_path / "empty", tmp_path, ready_status=503) as url:
        open_view(page, url + "/ui/")
        assert "No model version is loaded" in page.locator("[data-testid=state-no-model]").inner_text()
        assert page.locator("#model-status").inner_text() == "no model"
        shot(page, "no-model")


@pytest.mark.parametrize(
    ("path", "rendered"), [("/docs", ".swagger-ui .information-container .title"), ("/redoc", "redoc h1")]
)
def test_the_api_docs_render_with_nothing_fetched_from_elsewhere(
    page: Any, base: str, path: str, rendered: str
) -> None:
    """Swagger UI and ReDoc load their scripts, style and icon from the service itself (air-gapped clusters): every
    request the page makes goes to 127.0.0.1, and one that would leave is aborted and fails the test."""
    elsewhere: list[str] = []

    def only_loopback(route: Any) -> None:
        if route.request.url.startswith(base + "/"):
            route.continue_()
        else:
            elsewhere.append(route.request.url)
            route.abort()

    page.route("**/*", only_loopback)
    asked: list[str] = []
    blocked: dict[str, str] = {}
    page.on("request", lambda request: asked.append(request.url))
    page.on("requestfailed", lambda request: blocked.update({request.url: request.failure or ""}))
    page.goto(base + path)
    title = page.locator(rendered).first
    title.wait_for()
    assert "koord-recommender" in title.inner_text()
    page.wait_for_load_state("networkidle")
    # Nothing reached the network beyond loopback; what a build links elsewhere (ReDoc's logo) the page's
    # Content-Security-Policy stops inside the browser, before any connection.
    assert elsewhere == [], elsewhere
    outside = [url for url in asked if not url.startswith(base + "/")]
    assert all(blocked.get(url) == "csp" for url in outside), (outside, blocked)
    assert any("/docs/assets/" in url for url in asked)
    shot(page, path.strip("/"))
    assert httpx.get(base + "/docs/assets/swagger-ui.css", timeout=10).headers["content-type"].startswith("text/css")
    assert httpx.get(base + "/docs/assets/../routes/docs.py", timeout=10).status_code == 404
