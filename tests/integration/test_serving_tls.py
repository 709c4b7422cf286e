"""The three consumers over real HTTPS on loopback: a real `recommender serve` process, certificates made here.

One server (module scope) over a store trained by the real CLI on usage ending now; AdmissionReviews shaped as the
API server sends them; each returned JSON Patch is applied to the pod and the result checked. Also: the scheduler
extender in both modes, REST reads (auth, ETag, lines, chart, nodes), metrics, hot reload of the model and of the
certificate, and schemathesis over the OpenAPI schema.
"""

from __future__ import annotations

import json
import os
import socket
import ssl
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pandas as pd
import pytest
import schemathesis
import trustme
from hypothesis import HealthCheck, given
from hypothesis import settings as hsettings
from hypothesis import strategies as st

from recommender import koordinator as k
from recommender.mutation import APPLIED_ANNOTATION
from recommender.units import cpu_quantity, memory_quantity
from tests import k8s
from tests.conftest import DAY, entry_point, make_usage
from tests.integration.server import serving, tls_files

pytestmark = pytest.mark.integration
NAMES = {"w0": "web", "w1": "db", "w2": "nightly", "w3": "etl", "w4": "crunch"}
TOKEN = "s3cr3t-token"
PROFILES = [
    {
        "name": "batch",
        "namespaces": ["ns"],
        "selector": {"tier": "batch"},
        "qos_class": "BE",
        "priority_class_name": "koord-batch",
    }
]


def usage(end: int) -> pd.DataFrame:
    frame = make_usage(workloads=5, pods=2, days=3, start=end - 3 * DAY)
    frame["workload"] = frame["workload"].map(NAMES)
    sidecar = frame[frame["workload"] == "web"].assign(container="istio-proxy", cpu_cores=lambda f: f["cpu_cores"] / 10)
    return pd.concat([frame, sidecar], ignore_index=True).sort_values(
        ["namespace", "workload", "pod", "container", "timestamp"]
    )


def train(usage_frame: pd.DataFrame, workdir: Path, store: Path, *extra: str) -> None:
    path = workdir / f"usage-{time.monotonic_ns()}.csv.gz"
    usage_frame.to_csv(path, index=False)
    done = subprocess.run(
        [entry_point(), "train", "--input", str(path), "--store", str(store), *extra],
        capture_output=True,
        text=True,
        timeout=300,
        stdin=subprocess.DEVNULL,
    )
    assert done.returncode == 0, done.stderr


def write_cert(ca: trustme.CA, cert_file: Path, key_file: Path) -> trustme.LeafCert:
    leaf = ca.issue_cert("127.0.0.1", "localhost")
    # Replace both files by rename, as a Secret volume update does, key first.
    for pem, target in ((leaf.private_key_pem, key_file), (leaf.cert_chain_pems, cert_file)):
        blob = pem.bytes() if hasattr(pem, "bytes") else b"".join(p.bytes() for p in pem)
        scratch = target.with_suffix(".new")
        scratch.write_bytes(blob)
        os.replace(scratch, target)
    return leaf


def trusting(ca: trustme.CA) -> ssl.SSLContext:
    """A client context that trusts only `ca`."""
    context = ssl.create_default_context()
    ca.configure_trust(context)
    return context


@contextmanager
def tls_client(workdir: Path, env: dict[str, str], timeout: float) -> Iterator[httpx.Client]:
    """A client of `recommender serve` over TLS on the store in `workdir/store` (certificates made there), with `env`."""
    ca, cert, key, _ = tls_files(workdir)
    verify = trusting(ca)
    with serving(workdir / "store", workdir, tls=(cert, key), verify=verify, env=env) as base:
        with httpx.Client(base_url=base, verify=verify, timeout=timeout) as client:
            yield client


@dataclass
class Server:
    base: str
    client: httpx.Client
    workdir: Path
    store: Path
    ca: trustme.CA
    cert_file: Path
    key_file: Path

    def mutate(
        self, pod: dict[str, Any], namespace: str = "ns", dry_run: bool = False
    ) -> tuple[dict[str, Any], dict[str, Any]]:
        """(the AdmissionReview answer, the pod after its patch)."""
        response = self.client.post("/mutate", json=k8s.review(pod, namespace, dry_run))
        assert response.status_code == 200
        answer = response.json()
        return answer["response"], k8s.apply_response(pod, answer)

    def target(self, workload: str, container: str = "main") -> tuple[str, str]:
        rec = self.client.get(f"/api/v1/recommendations/ns/{workload}/{container}", headers=auth()).json()
        return cpu_quantity(rec["cpu"]["target"]), memory_quantity(rec["memory"]["target"])


def auth() -> dict[str, str]:
    return {"Authorization": f"Bearer {TOKEN}"}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    workdir = tmp_path_factory.mktemp("serving")
    store = workdir / "store"
    now = int(time.time())
    train(usage(now), workdir, store)
    ca = trustme.CA()
    cert_file, key_file = workdir / "tls.crt", workdir / "tls.key"
    write_cert(ca, cert_file, key_file)
    (workdir / "token").write_text(TOKEN + "\n")
    web = k8s.pod("deployment", "web", [k8s.container("main", {"requests": {"cpu": "1"}})])
    pods = [k8s.running(web, "ns", "busy", f"web-{i}") for i in range(4)]
    (workdir / "pods.json").write_text(json.dumps(k8s.listing("PodList", pods)))
    nodes = [
        k8s.node("busy", cpu="8"),
        k8s.node("idle", cpu="8"),
        k8s.node("strict", cpu="8", annotations={k.USAGE_THRESHOLDS_ANNOTATION: '{"cpu": 1}'}),
    ]
    (workdir / "nodes.json").write_text(json.dumps(k8s.listing("NodeList", nodes)))
    env = {
        "KOORD_RECOMMENDER_SERVE__STORE_POLL_SECONDS": "0.3",
        "KOORD_RECOMMENDER_SERVE__TLS_POLL_SECONDS": "0.3",
        "KOORD_RECOMMENDER_EXTENDER__PODS_FILE": str(workdir / "pods.json"),
        "KOORD_RECOMMENDER_EXTENDER__NODES_FILE": str(workdir / "nodes.json"),
        "KOORD_RECOMMENDER_WEBHOOK__COLOCATION_PROFILES": json.dumps(PROFILES),
        "KOORD_RECOMMENDER_AUTH__TOKEN_FILE": str(workdir / "token"),
        # Every pod of these tests opts in through the default; test_webhook_modes covers the opt-in sources.
        "KOORD_RECOMMENDER_WEBHOOK__DEFAULT_MODE": "Initial",
    }
    verify = trusting(ca)
    with serving(store, workdir, tls=(cert_file, key_file), verify=verify, env=env) as base:
        with httpx.Client(base_url=base, verify=verify, timeout=10) as client:
            yield Server(base, client, workdir, store, ca, cert_file, key_file)


@pytest.mark.parametrize(
    ("owner", "workload"),
    [("deployment", "web"), ("statefulset", "db"), ("cronjob", "nightly"), ("job", "etl"), ("bare", "crunch")],
)
def test_webhook_resolves_each_controller_and_sets_requests(server: Server, owner: str, workload: str) -> None:
    pod = k8s.pod(owner, workload, [k8s.container("main", k8s.RESOURCE_SHAPES["both"])])
    answer, patched = server.mutate(pod)
    cpu, memory = server.target(workload)
    resources = patched["spec"]["containers"][0]["resources"]
    assert resources["requests"] == {"cpu": cpu, "memory": memory}
    assert json.loads(patched["metadata"]["annotations"][APPLIED_ANNOTATION])["workload"] == workload
    assert "warnings" not in answer and k.violations(patched) == []


@pytest.mark.parametrize("shape", sorted(k8s.RESOURCE_SHAPES))
def test_webhook_patches_every_resources_shape(server: Server, shape: str) -> None:
    original = k8s.RESOURCE_SHAPES[shape]
    pod = k8s.pod(
        "deployment",
        "web",
        [k8s.container("main", original)],
        init_containers=[
            k8s.container("istio-proxy", original, restartPolicy="Always"),
            k8s.container("unknown-init", original),
        ],
    )
    _, patched = server.mutate(pod)
    cpu, memory = server.target("web")
    main = patched["spec"]["containers"][0]["resources"]
    assert main["requests"]["cpu"] == cpu and main["requests"]["memory"] == memory
    old_limits = (original or {}).get("limits") or {}
    assert set(main.get("limits", {})) == set(old_limits)  # limits are scaled, never invented
    sidecar_cpu, _ = server.target("web", "istio-proxy")
    assert patched["spec"]["initContainers"][0]["resources"]["requests"]["cpu"] == sidecar_cpu
    assert patched["spec"]["initContainers"][1] == pod["spec"]["initContainers"][1]
    assert k.violations(patched) == []


def test_webhook_batch_colocation_renames_resources(server: Server) -> None:
    pod = k8s.pod("deployment", "web", [k8s.container("main", k8s.RESOURCE_SHAPES["both"])], labels={"tier": "batch"})
    _, patched = server.mutate(pod)
    cpu, _ = server.target("web")
    assert patched["metadata"]["labels"][k.QOS_LABEL] == "BE" and patched["spec"]["priority"] == 5000
    requests = patched["spec"]["containers"][0]["resources"]["requests"]
    assert set(requests) == {"kubernetes.io/batch-cpu", "kubernetes.io/batch-memory"}
    assert requests["kubernetes.io/batch-cpu"] == str(int(float(cpu[:-1]) if cpu.endswith("m") else int(cpu) * 1000))
    assert k.violations(patched) == []


def test_dry_run_gets_the_same_patch(server: Server) -> None:
    pod = k8s.pod("deployment", "web", [k8s.container("main", k8s.RESOURCE_SHAPES["both"])])
    real, _ = server.mutate(pod)
    dry, _ = server.mutate(pod, dry_run=True)
    assert dry["patch"] == real["patch"]


@pytest.mark.parametrize(
    ("body", "warning"),
    [
        (b"not json", "malformed AdmissionReview"),
        (b"{}", "malformed AdmissionReview"),
        (b'{"request": {"uid": 5}}', "malformed AdmissionReview"),
        (b'{"request": {"uid": "u", "operation": "DELETE", "kind": {"kind": "Pod"}, "object": {}}}', "only pod CREATE"),
        (
            b'{"request": {"uid": "u", "operation": "CREATE", "kind": {"kind": "Pod"}, "object": {"spec": "x"}}}',
            "no recommendation",
        ),
        (
            b'{"request": {"uid": "u", "operation": "CREATE", "kind": {"kind": "Pod"}, "object": {"spec": {"containers": ["x"]}}}}',
            "internal error",
        ),
    ],
)
def test_webhook_fails_open(server: Server, body: bytes, warning: str) -> None:
    response = server.client.post("/mutate", content=body, headers={"Content-Type": "application/json"})
    assert response.status_code == 200
    answer = response.json()["response"]
    assert answer["allowed"] is True and "patch" not in answer and warning in answer["warnings"][0]
    # The API server discards an answer whose uid is not its request's: keep it whenever the body has one.
    assert answer["uid"] == ("u" if b'"uid": "u"' in body else "")


def test_unknown_workload_is_admitted_unchanged(server: Server) -> None:
    answer, _patched = server.mutate(k8s.pod("deployment", "stranger", [k8s.container("main", None)]))
    assert "patch" not in answer and "no recommendation" in answer["warnings"][0]


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=5),
    lambda children: st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=8), children, max_size=3),
    max_leaves=12,
)


@given(
    body=st.fixed_dictionaries(
        {
            "request": st.fixed_dictionaries(
                {
                    "uid": st.just("u"),
                    "operation": st.just("CREATE"),
                    "kind": st.just({"kind": "Pod"}),
                    "object": json_values,
                }
            )
        }
    )
    | json_values
)
@hsettings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_no_review_is_ever_refused_or_answered_5xx(server: Server, body: Any) -> None:
    response = server.client.post("/mutate", json=body)
    assert response.status_code == 200 and response.json()["response"]["allowed"] is True


def incoming() -> dict[str, Any]:
    pod = k8s.pod("deployment", "web", [k8s.container("main", {"requests": {"cpu": "1"}})])
    pod["metadata"]["namespace"] = "ns"
    return pod


def test_extender_name_only_mode(server: Server) -> None:
    args = {"Pod": incoming(), "NodeNames": ["busy", "idle", "strict", "ghost"]}
    filtered = server.client.post("/scheduler/filter", json=args).json()
    assert filtered["NodeNames"] == ["busy", "idle", "ghost"]
    assert list(filtered["FailedNodes"]) == ["strict"] and "> 1%" in filtered["FailedNodes"]["strict"]
    scores = {p["Host"]: p["Score"] for p in server.client.post("/scheduler/prioritize", json=args).json()}
    assert scores["idle"] > scores["busy"] and scores["ghost"] == 5 and all(0 <= s <= 10 for s in scores.values())


def test_extender_full_node_mode(server: Server) -> None:
    nodes = k8s.listing("NodeList", [k8s.node("busy", cpu="8"), k8s.node("tiny", cpu="1")])
    filtered = server.client.post("/scheduler/filter", json={"pod": incoming(), "nodes": nodes}).json()
    assert [n["metadata"]["name"] for n in filtered["Nodes"]["items"]] == ["busy"]
    assert "forecast CPU peak" in filtered["FailedNodes"]["tiny"] and filtered["Error"] == ""
    assert server.client.post("/scheduler/filter", content=b"]").json()["Error"]
    assert server.client.post("/scheduler/prioritize", json={"Pod": 1, "NodeNames": ["busy"]}).status_code == 200


def test_rest_auth_etag_lines_chart_and_nodes(server: Server) -> None:
    assert server.client.get("/api/v1/recommendations").status_code == 401
    assert server.client.get("/api/v1/recommendations", headers={"Authorization": "Bearer wrong"}).status_code == 401
    listed = server.client.get("/api/v1/recommendations", params={"workload": "web"}, headers=auth())
    assert {r["container"] for r in listed.json()["recommendations"]} == {"main", "istio-proxy"}
    again = server.client.get(
        "/api/v1/recommendations",
        params={"workload": "web"},
        headers={**auth(), "If-None-Match": listed.headers["ETag"]},
    )
    assert again.status_code == 304 and again.content == b""
    lines = server.client.get("/api/v1/recommendations/ns/web/main/lines", headers=auth()).json()
    assert lines["provenance"]["version"] == listed.json()["version"]
    assert len(lines["cpu_cores"]["short_term_reservation"]) == 288 and lines["cpu_cores"]["limit"] == 2.0
    chart = server.client.get("/api/v1/recommendations/ns/web/main/chart.png", headers=auth())
    assert chart.headers["content-type"] == "image/png" and chart.content.startswith(b"\x89PNG")
    assert server.client.get("/api/v1/nodes", headers=auth()).json() == ["busy", "idle", "strict"]
    busy = server.client.get("/api/v1/nodes/busy/lines", headers=auth()).json()
    assert busy["cpu_cores"]["allocatable"] == 8 and min(busy["cpu_cores"]["short_term_reservation"]) > 0
    assert busy["pods"] and {"namespace", "pod", "workload", "priority_class"} == set(busy["pods"][0])
    cpu = busy["cpu_cores"]
    assert cpu["limit"] is not None and cpu["long_term_reservation"] > 0 and cpu["system_usage"] is None
    reclaimable = cpu["reclaimable"]
    assert 0 <= reclaimable["batch"] <= 8 and 0 <= reclaimable["mid"] <= 8 and reclaimable["policy"] == "per-pod lines"
    assert set(reclaimable["koordinator"]) == {"usage", "request", "max_usage_request", "mid"}
    assert reclaimable["koordinator"]["request"] is None  # Koordinator's request policy is memory-only
    assert busy["memory_bytes"]["reclaimable"]["koordinator"]["request"] is not None
    chart = server.client.get("/api/v1/nodes/busy/chart.png", headers=auth())
    assert chart.headers["content-type"] == "image/png" and chart.content.startswith(b"\x89PNG")
    assert server.client.get("/api/v1/nodes/nowhere/lines", headers=auth()).status_code == 404


def test_metrics(server: Server) -> None:
    server.mutate(k8s.pod("deployment", "web", [k8s.container("main", None)]), dry_run=True)
    assert server.client.get("/metrics").status_code == 401  # every container's target is in there
    text = server.client.get("/metrics", headers=auth()).text
    assert 'koord_recommender_webhook_decisions_total{dry_run="true",outcome="patched"}' in text
    assert (
        'koord_recommender_http_request_duration_seconds_bucket{le="0.005",method="POST",route="/mutate",status="200"}'
        in text
    )
    assert "koord_recommender_model_age_seconds" in text and 'koord_recommender_model_info{version="' in text
    assert (
        'koord_recommender_recommendation{bound="target",container="main",namespace="ns",resource="cpu",workload="web"}'
        in text
    )
    # Usage sits below the target most of the day (target = p90 x 1.15): most relative diffs are negative.
    below = next(
        float(line.split()[-1])
        for line in text.splitlines()
        if line.startswith(
            'koord_recommender_quality_usage_recommendation_relative_diffs_bucket{le="0.0",resource="cpu"}'
        )
    )
    total = next(
        float(line.split()[-1])
        for line in text.splitlines()
        if line.startswith(
            'koord_recommender_quality_usage_recommendation_relative_diffs_bucket{le="+Inf",resource="cpu"}'
        )
    )
    assert total > 0 and below / total > 0.8


def served_certificate(base: str) -> bytes:
    host, port = base.removeprefix("https://").split(":")
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    with socket.create_connection((host, int(port)), timeout=5) as raw, context.wrap_socket(raw) as tls:
        der = tls.getpeercert(binary_form=True)
    assert der is not None
    return der


def test_certificate_is_reloaded_when_the_files_change(server: Server) -> None:
    before = served_certificate(server.base)
    new_ca = trustme.CA()
    leaf = write_cert(new_ca, server.cert_file, server.key_file)
    expected = ssl.PEM_cert_to_DER_cert(leaf.cert_chain_pems[0].bytes().decode())
    deadline = time.monotonic() + 15
    for _ in range(150):
        if served_certificate(server.base) == expected or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert served_certificate(server.base) == expected != before
    with httpx.Client(base_url=server.base, verify=trusting(new_ca)) as client:
        assert client.get("/healthz").status_code == 200
    server.client.close()
    server.client = httpx.Client(base_url=server.base, verify=trusting(new_ca), timeout=10)
    server.ca = new_ca


def test_new_model_version_is_picked_up_without_restart(server: Server) -> None:
    before = server.client.get("/readyz").json()["version"]
    train(usage(int(time.time())).assign(cpu_cores=lambda f: f["cpu_cores"] * 2), server.workdir, server.store)
    published = (server.store / "latest").read_text().strip()
    deadline = time.monotonic() + 20
    seen = set()
    for _ in range(400):  # every answer during the swap is a whole version
        response = server.client.get("/api/v1/recommendations", headers=auth())
        assert response.status_code == 200
        seen.add(response.json()["version"])
        if response.json()["version"] == published or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert published != before and seen <= {before, published} and published in seen


def test_openapi_schema_fuzzed_never_5xx(server: Server) -> None:
    spec = server.client.get("/openapi.json", headers=auth()).json()
    for path in (
        "/mutate",
        "/scheduler/filter",
        "/scheduler/prioritize",
        "/api/v1/recommendations",
        "/metrics",
        "/healthz",
        "/readyz",
    ):
        assert path in spec["paths"]
    schema = schemathesis.openapi.from_dict(spec)
    ca_file = server.workdir / "ca.pem"
    server.ca.cert_pem.write_to_path(str(ca_file))
    checked = 0
    for operation in schema.get_all_operations():
        strategy = operation.ok().as_strategy()

        @given(case=strategy)
        @hsettings(max_examples=15, deadline=None, suppress_health_check=list(HealthCheck))
        def check(case: Any) -> None:
            response = case.call(base_url=server.base, verify=str(ca_file), headers=auth(), timeout=10)
            assert response.status_code < 500, (case.method, case.formatted_path, response.text[:200])

        check()
        checked += 1
    assert checked >= 10


def test_stale_model_is_not_applied(tmp_path: Path) -> None:
    train(usage(int(time.time()) - 30 * DAY), tmp_path, tmp_path / "store")
    with serving(tmp_path / "store", tmp_path) as base:
        review = k8s.review(k8s.pod("deployment", "web", [k8s.container("main", None)]), "ns")
        answer = httpx.post(base + "/mutate", json=review).json()["response"]
        assert answer["allowed"] is True and "patch" not in answer
        assert "h old, pod admitted unchanged" in answer["warnings"][0]


def test_a_model_dated_in_the_future_is_not_applied_nor_called_fresh(tmp_path: Path) -> None:
    # Issue 13: a decision time in the future (a millisecond timestamp) gave a negative age, read as fresh.
    now = int(time.time())
    train(usage(now - 3 * DAY), tmp_path, tmp_path / "store", "--as-of", str(now + 30 * DAY))
    with serving(tmp_path / "store", tmp_path) as base:
        review = k8s.review(k8s.pod("deployment", "web", [k8s.container("main", None)]), "ns")
        answer = httpx.post(base + "/mutate", json=review).json()["response"]
        assert answer["allowed"] is True and "patch" not in answer
        assert "in the future" in answer["warnings"][0] and "pod admitted unchanged" in answer["warnings"][0]
        status = httpx.get(base + "/api/v1/status", headers=auth()).json()
        assert status["age_seconds"] < 0 and status["stale"] is True


def test_token_review_against_the_api_server(tmp_path: Path) -> None:
    from tests import fake_apiserver
    from tests.integration.server import fake_apiserver_command, free_port, started, tls_files

    train(usage(int(time.time())), tmp_path, tmp_path / "store")
    ca, cert, key, ca_file = tls_files(tmp_path, "api")
    (tmp_path / "sa-token").write_text(fake_apiserver.SERVICE_ACCOUNT_TOKEN)
    api = f"https://127.0.0.1:{free_port()}"
    fake = fake_apiserver_command(api, cert, key)
    env = {
        "KOORD_RECOMMENDER_AUTH__TOKEN_REVIEW": "true",
        "KOORD_RECOMMENDER_AUTH__API_SERVER_URL": api,
        "KOORD_RECOMMENDER_AUTH__API_SERVER_CA_FILE": str(ca_file),
        "KOORD_RECOMMENDER_AUTH__SERVICE_ACCOUNT_TOKEN_FILE": str(tmp_path / "sa-token"),
    }
    repo = Path(__file__).resolve().parents[2]
    with (
        started(fake, api, cwd=repo, verify=trusting(ca), ready_path="/reviews"),
        serving(tmp_path / "store", tmp_path, env=env) as base,
    ):

        def get(token: str) -> int:
            return httpx.get(base + "/api/v1/recommendations", headers={"Authorization": f"Bearer {token}"}).status_code

        assert [get(fake_apiserver.USER_TOKEN) for _ in range(3)] == [200, 200, 200]
        assert get("someone-else") == 401 and httpx.get(base + "/api/v1/recommendations").status_code == 401
        # One review per distinct token: answers are cached.
        assert httpx.get(api + "/reviews", verify=trusting(ca)).json() == {"reviews": 2}
